"""vllm-sr-runtime: an inference runtime for vLLM Semantic Router decision models."""

from runtime.model import DecisionModel, load

__all__ = ["DecisionModel", "load"]
