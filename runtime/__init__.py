"""vllm-sr-runtime: an inference runtime for vLLM Semantic Router decision models.

`vllm_sr_runtime.load(package, device="cpu", profile="exact")` returns a model whose `ask(state, questions)`
answers. Imports are lazy so the CLI (and the gunicorn master) start without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers and editors see the real signature; at run time torch loads on the first call
    from vllm_sr_runtime.model import DecisionModel, load
else:

    def load(*args: Any, **kwargs: Any):
        """Resolve and verify a package, build the profile's engine, return a model whose `ask(state, questions)`
        answers. The parameters and their documentation: `help(vllm_sr_runtime.model.load)` (importing it loads
        torch, which this lazy entry defers to the first call)."""
        from vllm_sr_runtime.model import load as model_load

        return model_load(*args, **kwargs)


def __getattr__(name: str):
    if name == "DecisionModel":
        from vllm_sr_runtime.model import DecisionModel

        return DecisionModel
    raise AttributeError(name)


__all__ = ["DecisionModel", "load"]
