"""Serving: registry, OpenAI API, protocol, limits, metrics, chat, Ray Serve."""
