"""The export's choices that its command line offers: read by the CLI parser, which every command builds (`serve`'s
gunicorn master too), so this module imports nothing heavy (the exporter imports torch)."""

from __future__ import annotations

VARIANTS = ("contrib", "portable")
SUPPORTED_DTYPES = ("fp32", "fp16", "bf16", "int8")  # int8: dynamic (activation) x signed int8 weight MatMuls on the CPU EP
# bf16 is for the CUDA provider's contrib kernels; int8's MatMulInteger with zero points and
# DynamicQuantizeLinear are not in the MIGraphX provider's list.
PORTABLE_DTYPES = ("fp32", "fp16")
# The variants that write media graphs for a package with a vision tower: portable has none yet (MIGraphX compiles
# static shapes; the vision tower's patch count varies per request).
MEDIA_VARIANTS = ("contrib",)
DEFAULT_OPSET = 23
# torch.onnx's exporter writes nothing below 18; at 26 its Attention node fails the ONNX checker (torch 2.13, onnx 1.23)
MIN_OPSET, MAX_OPSET = 18, 25
