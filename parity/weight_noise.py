"""`parity --weight-noise int8`: the eager model with Gaussian noise of int8's rounding size on every weight
that `--dtype int8` quantizes. It tells whether a package tolerates any 8-bit weight form, apart from how an
int8 artifact quantizes its activations. Measured on `--suite short` of confident d3-lite packages: seed 3,
which the int8 artifact fails (11/80 decisions changed, |dp| median 0.108), fails under this weight noise
alone too (4/80, median 0.082); seed 0, which int8 passes (0/80, median 0.00057), passes it (0/80, 0.00013);
a Decision 2.0 Eos-class package (seed 3; int8 24/80) changes 16/80 under it."""

from __future__ import annotations

import torch

from vllm_sr_runtime.export.int8 import QMAX, stays_fp32


def perturb_like_int8(model, factor: float = 1.0, seed: int = 0) -> dict:
    """Add to each Linear weight that int8 quantizes (the family's quantized towers, less the weights int8 keeps
    FP32) seeded Gaussian noise whose RMS per output channel is `factor` x int8's rounding error there:
    (max |w| over the channel / 127) / sqrt(12). Adapter (LoRA) matrices are left alone: int8 quantizes the
    merged weight, approximated here by perturbing the base weight. Returns what was perturbed."""
    towers = model.family.export_spec.quantized_towers
    generator = torch.Generator().manual_seed(seed)
    perturbed = 0
    with torch.no_grad():
        for name, layer in model.engine.module.named_modules():
            if not isinstance(layer, torch.nn.Linear) or ".lora_" in f".{name}" or stays_fp32(f"{name}.weight", towers):
                continue
            weight = layer.weight
            step = weight.abs().amax(dim=1, keepdim=True).float() / QMAX
            noise = torch.randn(weight.shape, generator=generator) * step * (factor / 12**0.5)
            weight.add_(noise.to(weight.dtype))
            perturbed += 1
    if not perturbed:
        raise ValueError(f"--weight-noise: {model.name} has no Linear weight that int8 would quantize")
    return {"form": "int8", "factor": factor, "seed": seed, "weights": perturbed}
