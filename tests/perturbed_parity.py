"""Test-only: `vllm-sr-runtime parity` whose candidate's readout gets seeded noise, so the gates can be seen to
fire. Usage: python tests/perturbed_parity.py SCALE PARITY-ARGUMENTS..."""

from __future__ import annotations

import sys

import numpy as np

import vllm_sr_runtime
from vllm_sr_runtime.cli import main


class PerturbedEngine:
    """Test-only: adds seeded noise to an engine's readout (logits, or probabilities in log space) so the
    gates can be seen to fire."""

    def __init__(self, engine, scale: float, probabilities: bool):
        self.engine, self.scale, self.probabilities = engine, scale, probabilities
        self.name = f"{engine.name}+noise"
        self.rng = np.random.default_rng(0)

    def forward(self, inputs):
        return self._noisy(self.engine.forward(inputs))

    def forward_shared(self, inputs):
        return self._noisy(self.engine.forward_shared(inputs))

    def forward_media(self, inputs):
        return self._noisy(self.engine.forward_media(inputs))

    @property
    def reads_media(self) -> bool:
        return bool(getattr(self.engine, "reads_media", False))

    def _noisy(self, output):
        noise = self.rng.normal(0.0, self.scale, size=output.shape).astype(output.dtype)
        return output * np.exp(noise) if self.probabilities else output + noise


def perturb_candidate(scale: float) -> None:
    """`parity` loads the reference first and the candidate second: wrap the second model's engine."""
    real_load, loaded = vllm_sr_runtime.load, []

    def load(*args, **kwargs):
        model = real_load(*args, **kwargs)
        loaded.append(model)
        if len(loaded) == 2:
            model.engine = PerturbedEngine(model.engine, scale, model.family.output_name == "probabilities")
        return model

    vllm_sr_runtime.load = load


if __name__ == "__main__":
    perturb_candidate(float(sys.argv[1]))
    sys.exit(main(["parity", *sys.argv[2:]]))
