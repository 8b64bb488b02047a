"""Serving: registry, OpenAI API, protocol, HTTP guards and launcher, metrics, chat, Ray Serve."""
