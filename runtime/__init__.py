"""vllm-sr-runtime: an inference runtime for vLLM Semantic Router decision models.

`vllm_sr_runtime.load(package, device="cpu", profile="exact")` returns a model whose `ask(state, questions)`
answers. Imports are lazy so the CLI (and the gunicorn master) start without torch.
"""

from __future__ import annotations

from typing import Any


def load(*args: Any, **kwargs: Any):
    from vllm_sr_runtime.model import load as _load

    return _load(*args, **kwargs)


def __getattr__(name: str):
    if name == "DecisionModel":
        from vllm_sr_runtime.model import DecisionModel

        return DecisionModel
    raise AttributeError(name)


__all__ = ["DecisionModel", "load"]
