"""The int8 export's options and their defaults, in a module without torch or onnx so the CLI can offer them
(`vllm-sr-runtime --help` loads neither)."""

from __future__ import annotations

from vllm_sr_runtime.cpu_features import FULL_WEIGHT_BITS, SAFE_WEIGHT_BITS

# one activation scale per token (default), per tensor (ORT quantize_dynamic's form), or per token and block of 32
# channels with weights per block too (ORT's MatMulNBits at 8 bits)
ACTIVATION_FORMS = ("token", "tensor", "block")
# what the manifest says of each form: (activations, weights)
INT8_FORMS = {
    "token": ("per token", "per output channel, symmetric"),
    "tensor": ("per tensor", "per output channel, symmetric"),
    "block": ("per token and block of 32 channels", "per output channel and block of 32 inputs, symmetric"),
}
INT8_FP32_CHOICES = ("measured", "rule")  # which MatMuls stay FP32 beyond the fixed rule: measured per package, or none
# where the measured choice moves the Linears int8 per token harms most: straight to FP32 (default), or first to the
# block form (MatMulNBits), FP32 only where that is not enough. The block form is not the default: on d3-lite seed 0
# (510 tokens, one bench run) it moved 17% of the multiply-adds out of FP32 (FP32 kept 24% -> 8%) and ran no faster
# (1,981 ms against 1,975: its MatMulNBits ran those MACs only ~1.2x faster than FP32 MatMul in the graph; parity
# 0/80 both), and on seed 3 it changed 2/80 decisions on `parity --suite short` against 1/80 (86% FP32 + 6% blocked against 92% FP32)
# `split`: the MatMuls that would stay FP32 (the fixed rule's and the measured ones) run as two int8 halves of weight
# and activation instead (a value ~ scale * (high + low / 254): ~15 bits against int8's 7, two integer products).
INT8_SENSITIVE_CHOICES = ("fp32", "block", "split")
# Bits of the int8 weights that the integer products read (per token, per tensor, split): 8 (default), or 7 for x86 hosts
# without VNNI, whose u8 x s8 kernel (AVX2, AVX-512 without VNNI) saturates on pairs of 8-bit products; the serving
# runtime refuses an 8-bit artifact on such a host (vllm_sr_runtime.cpu_features).
WEIGHT_BITS_CHOICES = (FULL_WEIGHT_BITS, SAFE_WEIGHT_BITS)
# The token embedding table under --dtype int8: FP32 (default), or int8 with one scale per row (a Gather of the rows
# and their scales, then Cast and Mul: no integer product reads it, so 8 bits on every host). The table is most of an
# int8 artifact's bytes (d3-lite, rule: 1,017 of 1,672 MB) and each token reads only its own row.
EMBEDDING_CHOICES = ("fp32", "int8")
# A decision flips when the margin moves by more than itself; keeping every row's predicted spread under a quarter
# of its margin puts a flip 4 standard deviations away on the calibration rows, which leaves room for prompts
# with smaller margins than theirs.
DEFAULT_TARGET = 0.25
# Where the measured choice keeps at least this share of the quantizable multiply-adds FP32, int8 runs not far from
# fp32's speed (d3-lite seed 0, 510 tokens, one bench run: the rule's int8 2.63x exact, 24% kept 2.22x, fp32 1.34x), so
# the export says so.
MOSTLY_FP32_SHARE = 0.5
