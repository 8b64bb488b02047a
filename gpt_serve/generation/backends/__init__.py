"""Backends: the interface every backend implements, loading, PyTorch, ONNX Runtime."""
