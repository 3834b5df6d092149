"""Answers of question rows already computed, per served model: an LRU keyed by a content hash of everything
an answer depends on (the model's weights, profile, engine and dtype, the artifact's graph, the row's rendered
token ids and its question's options). Rows that read images or videos are not cached."""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

DEFAULT_ENTRIES = 16_384


def _graph_identity(engine: Any) -> str:
    """The artifact graph an ONNX Runtime engine runs (its model.onnx hash); empty for eager engines."""
    manifest = getattr(engine, "artifact", None) or {}
    files = manifest.get("files") or {}
    return str((files.get(manifest.get("model_file") or "model.onnx") or {}).get("sha256", ""))


class ResultCache:
    def __init__(self, entries: int = DEFAULT_ENTRIES, on_record=None):
        self.entries = entries
        self._answers: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.on_record = on_record  # callable(hits, misses): the server's metrics

    def record(self, hits: int = 0, misses: int = 0) -> None:
        with self._lock:
            self.hits += hits
            self.misses += misses
        if self.on_record is not None:
            self.on_record(hits, misses)

    def key(self, model: Any, profile: str, item: Any) -> str:
        question = item.question
        parts = {
            "model_sha256": model.family.package.model_sha256, "profile": profile, "engine": model.engine.name,
            "dtype": model.dtype, "graph": _graph_identity(model.engine), "type": question.type,
            "options": [[option.key, repr(option.description)] for option in question.options],
        }  # fmt: skip
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
        digest.update(b"\0" + b",".join(str(token).encode() for token in item.token_ids))
        return digest.hexdigest()

    def get(self, key: str) -> dict | None:
        with self._lock:
            answer = self._answers.get(key)
            if answer is None:
                return None
            self._answers.move_to_end(key)
            return copy.deepcopy(answer)

    def put(self, key: str, answer: dict) -> None:
        if "error" in answer:  # an invalid model output is not kept
            return
        with self._lock:
            self._answers[key] = copy.deepcopy(answer)
            self._answers.move_to_end(key)
            while len(self._answers) > self.entries:
                self._answers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._answers)
