"""The 255-code readout (FP32 on device) and the host-side answers of Decision 3.0."""

from __future__ import annotations

import torch
from torch import nn

from vllm_sr_runtime.families.answers import build_answer, renormalize
from vllm_sr_runtime.families.questions import Question

TIE_TOLERANCE = 0.0  # first option on exact ties


class CodeReadout(nn.Module):
    """h.float() @ W.T over all 255 codes, unused codes masked, / temperature, softmax in FP32."""

    def __init__(self, weight: torch.Tensor, temperature: float):
        super().__init__()
        self.register_buffer("weight", weight.float().contiguous())
        self.temperature = float(temperature)

    def forward(self, last_hidden: torch.Tensor, option_mask: torch.Tensor) -> torch.Tensor:
        logits = last_hidden.float() @ self.weight.T
        logits = logits.masked_fill(~option_mask, float("-inf")) / self.temperature
        return torch.softmax(logits, dim=-1)


def answer_from_probabilities(question: Question, probabilities: list[float]) -> dict:
    kept = renormalize(probabilities[: len(question.options)])
    return build_answer(question, kept, tie_tolerance=TIE_TOLERANCE)
