"""Backends: protocol, loading, PyTorch, ONNX Runtime."""
