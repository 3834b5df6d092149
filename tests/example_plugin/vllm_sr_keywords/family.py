"""The `keywords` family: a package is one keywords.json; an option's probability grows with how many of its
words (its criterion, or for noul's yes the instructions) occur in the state."""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vllm_sr_runtime.errors import PackageError, QuestionError
from vllm_sr_runtime.families.answers import build_answer, softmax
from vllm_sr_runtime.families.base import Batch, Family
from vllm_sr_runtime.families.questions import Question
from vllm_sr_runtime.packages.resolve import PackageRef

FORMAT = "vllm-sr-keywords/1"
PACKAGE_FILE = "keywords.json"
ROWS_PER_PASS = 8
WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class KeywordPackage:
    root: Path
    model_name: str
    sharpness: float  # logits = sharpness x matched words
    stopwords: frozenset[str]
    model_sha256: str
    max_words: int

    @property
    def manifest_sha256(self) -> str:
        return self.model_sha256  # one file: the package is its own manifest


def write_package(root: Path, model_name: str = "keywords-demo", sharpness: float = 1.5) -> Path:
    """A keywords package (the format's whole writer)."""
    root.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "model_name": model_name, "sharpness": sharpness, "stopwords": ["a", "an", "the", "is", "this", "of", "to"], "max_words": 4096}
    (root / PACKAGE_FILE).write_text(json.dumps(body, indent=1) + "\n")
    return root


def word_ids(text: Any, stopwords: frozenset[str]) -> list[int]:
    text = text if isinstance(text, str) else json.dumps(text, sort_keys=True)
    return [zlib.crc32(word.encode()) for word in WORD.findall(text.lower()) if word not in stopwords]


@dataclass
class RenderedQuestion:
    question: Question
    state_ids: list[int]
    option_ids: list[list[int]]
    token_ids: list[int]  # everything the answer depends on (the result cache's key, the request's size)


class KeywordFamily(Family):
    name = "keywords"
    input_names = ("state_ids", "option_ids", "option_mask")
    shared_input_names = ()
    output_name = "counts"
    dynamic_axes = {"state_ids": {0: "batch", 1: "words"}, "option_ids": {0: "batch", 1: "options", 2: "words"}, "option_mask": {0: "batch", 1: "options"}}
    numerics_policy = {}  # no torch module
    engines = {"exact": "counting", "batching": "counting"}  # both profiles run on this plugin's engine
    profiles = ("exact", "batching")
    pad_id = -1

    @classmethod
    def detect(cls, root: Path) -> bool:
        path = Path(root) / PACKAGE_FILE
        return path.is_file() and f'"{FORMAT}"' in path.read_text()[:200]

    @classmethod
    def open(cls, ref: PackageRef, **options: Any) -> "KeywordFamily":
        path = ref.path / PACKAGE_FILE
        raw = path.read_bytes()
        try:
            body = json.loads(raw)
            package = KeywordPackage(
                ref.path, str(body["model_name"]), float(body["sharpness"]), frozenset(body.get("stopwords", ())),
                hashlib.sha256(raw).hexdigest(), int(body.get("max_words", 4096)),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise PackageError(f"not a {FORMAT} package: {exc}", str(path)) from None
        return cls(ref, package)

    def render(self, state: Any, question: Question) -> RenderedQuestion:
        stop = self.package.stopwords
        state_ids = word_ids(state, stop)
        if len(state_ids) > self.max_input_tokens:
            raise QuestionError("max_length_exceeded", f"the state has {len(state_ids)} words; this model reads at most {self.max_input_tokens}")
        if question.type == "noul":  # no: nothing to find; yes: the instructions' words
            option_ids = [[], word_ids(question.instructions or "", stop)]
        else:
            option_ids = [word_ids(option.description, stop) for option in question.options]
        token_ids = [*state_ids, -2, *word_ids(question.instructions or "", stop)]
        return RenderedQuestion(question, state_ids, option_ids, token_ids)

    def batches(self, rendered: list[RenderedQuestion]) -> list[Batch]:
        groups = [rendered[start : start + ROWS_PER_PASS] for start in range(0, len(rendered), ROWS_PER_PASS)]
        return [Batch(inputs=self.rows(group), items=group) for group in groups]

    def rows(self, group: list[RenderedQuestion]) -> dict[str, np.ndarray]:
        width = max(1, max(len(item.state_ids) for item in group))
        options = max(len(item.option_ids) for item in group)
        words = max(1, max(len(ids) for item in group for ids in item.option_ids))
        state = np.full((len(group), width), -1, dtype=np.int64)
        option_ids = np.full((len(group), options, words), -1, dtype=np.int64)
        mask = np.zeros((len(group), options), dtype=bool)
        for row, item in enumerate(group):
            state[row, : len(item.state_ids)] = item.state_ids
            for index, ids in enumerate(item.option_ids):
                option_ids[row, index, : len(ids)] = ids
                mask[row, index] = True
        return {"state_ids": state, "option_ids": option_ids, "option_mask": mask}

    def answer(self, item: RenderedQuestion, output_row: np.ndarray) -> dict:
        counts = output_row[: len(item.question.options)]
        return build_answer(item.question, softmax([self.package.sharpness * float(c) for c in counts]), tie_tolerance=0.0)

    @property
    def max_input_tokens(self) -> int:
        return self.package.max_words

    def card(self) -> dict:
        return {**super().card(), "question_types": ["choice", "noul", "score"]}
