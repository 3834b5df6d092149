"""The segmented-options prompt (`decision2-segmented-options-global-query-v1`) and right-padded rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from vllm_sr_runtime.errors import QuestionError
from vllm_sr_runtime.families.questions import Question
from vllm_sr_runtime.packages.files import canonical_text

PROMPT_VERSION = "decision2-segmented-options-global-query-v1"
SUFFIX = "\n\nSelect the single option best supported by the context and instructions.\nDecision:"
NOUL_DEFAULTS = ("No", "Yes")
ROW_MULTIPLE = 8


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else canonical_text(value)


def option_descriptions(question: Question) -> list[Any]:
    if question.type == "noul":
        return [default if option.description is None else option.description for option, default in zip(question.options, NOUL_DEFAULTS)]
    return [option.description for option in question.options]


def segments(state: Any, question: Question) -> tuple[str, list[str], str]:
    instructions = "" if question.instructions is None else as_text(question.instructions)
    prefix = f"Context:\n{as_text(state)}\n\nTask type: {question.type}\nQuestion:\n{instructions}\nOptions:"
    options = [
        "\n<option>\n" + canonical_text({"key": option.key, "description": description}) + "\n</option>"
        for option, description in zip(question.options, option_descriptions(question))
    ]
    return prefix, options, SUFFIX


@dataclass
class RenderedQuestion:
    question: Question
    token_ids: list[int]
    option_ends: list[int]

    @property
    def query_index(self) -> int:
        return len(self.token_ids) - 1


def render_question(state: Any, question: Question, tokenizer: Tokenizer, max_input_tokens: int) -> RenderedQuestion:
    try:
        prefix, options, suffix = segments(state, question)
    except ValueError as exc:  # NaN / Infinity in JSON values
        raise QuestionError("invalid_question", f"value cannot be rendered as JSON: {exc}") from None
    ids = list(tokenizer.encode(prefix, add_special_tokens=False).ids)
    ends: list[int] = []
    for index, segment in enumerate(options):
        piece = tokenizer.encode(segment, add_special_tokens=False).ids
        if not piece:
            raise QuestionError("invalid_question", f"option {question.options[index].key!r} tokenizes to nothing")
        ids.extend(piece)
        ends.append(len(ids) - 1)
    tail = tokenizer.encode(suffix, add_special_tokens=False).ids
    if not tail:
        raise QuestionError("invalid_question", "the prompt suffix tokenizes to nothing")
    ids.extend(tail)
    if len(ids) > max_input_tokens:
        raise QuestionError(
            "max_length_exceeded", f"the prompt is {len(ids)} tokens, over this model's limit of {max_input_tokens}"
        )
    return RenderedQuestion(question=question, token_ids=ids, option_ends=ends)


def batch_rows(rendered: list[RenderedQuestion], pad_id: int) -> dict[str, np.ndarray]:
    """Rows in request order, right-padded to a multiple of 8; option endpoints padded with a mask."""
    longest = max(len(item.token_ids) for item in rendered)
    width = -(-longest // ROW_MULTIPLE) * ROW_MULTIPLE
    widest = max(len(item.option_ends) for item in rendered)
    count = len(rendered)
    input_ids = np.full((count, width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((count, width), dtype=np.int64)
    option_index = np.zeros((count, widest), dtype=np.int64)
    option_mask = np.zeros((count, widest), dtype=bool)
    query_index = np.zeros((count,), dtype=np.int64)
    for row, item in enumerate(rendered):
        length = len(item.token_ids)
        input_ids[row, :length] = item.token_ids
        attention_mask[row, :length] = 1
        option_index[row, : len(item.option_ends)] = item.option_ends
        option_mask[row, : len(item.option_ends)] = True
        query_index[row] = item.query_index
    position_ids = np.broadcast_to(np.arange(width, dtype=np.int64), (count, width)).copy()
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "option_index": option_index,
        "option_mask": option_mask,
        "query_index": query_index,
    }
