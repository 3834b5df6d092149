"""The shared candidate head (FP32) and the host-side answer math of Decision 2.0."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from vllm_sr_runtime.families.answers import build_answer, softmax
from vllm_sr_runtime.families.questions import Question

TIE_TOLERANCE = 1e-8


class CandidateHead(nn.Module):
    """logit_i = <key c_i, query q>/sqrt(d) + scalar . GELU(candidate_mlp c_i + query_mlp q), c and q layer-normed."""

    def __init__(self, hidden: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.candidate_norm = nn.LayerNorm(hidden)
        self.query_norm = nn.LayerNorm(hidden)
        self.key = nn.Linear(hidden, head_dim, bias=False)
        self.query = nn.Linear(hidden, head_dim, bias=False)
        self.candidate_mlp = nn.Linear(hidden, head_dim)
        self.query_mlp = nn.Linear(hidden, head_dim, bias=False)
        self.scalar = nn.Linear(head_dim, 1, bias=False)

    def forward(
        self, hidden: torch.Tensor, option_index: torch.Tensor, option_mask: torch.Tensor, query_index: torch.Tensor
    ) -> torch.Tensor:
        hidden = hidden.float()
        size = hidden.shape[-1]
        candidates = torch.gather(hidden, 1, option_index.unsqueeze(-1).expand(-1, -1, size))
        query = torch.gather(hidden, 1, query_index.view(-1, 1, 1).expand(-1, 1, size))
        candidates = self.candidate_norm(candidates)
        query = self.query_norm(query)
        bilinear = (self.key(candidates) * self.query(query)).sum(-1) / math.sqrt(self.head_dim)
        mlp = self.scalar(F.gelu(self.candidate_mlp(candidates) + self.query_mlp(query))).squeeze(-1)
        logits = bilinear + mlp
        return logits.masked_fill(~option_mask, float("-inf"))


def answer_from_logits(
    question: Question,
    logits: list[float],
    *,
    temperature_by_type: dict[str, float],
    score_offsets: dict[int, list[float]],
) -> dict:
    """Offsets (score, by level count) before temperature, then a double-precision softmax."""
    values = [float(v) for v in logits[: len(question.options)]]
    if question.type == "score" and len(values) in score_offsets:
        values = [v + o for v, o in zip(values, score_offsets[len(values)])]
    temperature = temperature_by_type.get(question.type, 1.0)
    probabilities = softmax([v / temperature for v in values])
    return build_answer(question, probabilities, tie_tolerance=TIE_TOLERANCE)
