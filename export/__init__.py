"""export: the model folder -> ONNX exporter of gpt-serve (`python -m export MODEL_DIR`, `gpt-serve export`).

It writes `MODEL_DIR/onnx/model.onnx` (fp32) and `MODEL_DIR/onnx/model_quantized.onnx` (int8 weights), each a
KV-cache decoder graph named the Hugging Face way, validates them against PyTorch and on real text before it
installs them, and records the numbers in the model card. The runtime side is
`gpt_serve.generation.backends.onnx_backend`;
the file, input/output and metadata names both sides use are `gpt_serve.onnx_contract`'s.
"""

from .exporter import ExportReport, export_model
from .onnx_export import OPSET

__all__ = ["ExportReport", "export_model", "OPSET"]
