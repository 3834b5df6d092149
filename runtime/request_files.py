"""Request files: JSONL with one System One request per line (`{"id": "optional", "state": ..., "questions":
{...}, "images": [...], "videos": [...]}`), read by `parity --suite FILE` and `export --int8-calibration FILE`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.families.questions import parse_questions


@dataclass
class SuiteRequest:
    id: str
    state: Any
    questions: dict
    images: list[str] | None = None  # base64 data URLs (Decision 3.0 models with a vision tower)
    videos: list[str] | None = None


def load_jsonl(path: Path) -> list[SuiteRequest]:
    """Every request of the file, in order; ValueError naming the line for one that is not a request (checked as
    the server checks a request's questions, so a bad line is found before any model is loaded)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(body, dict) or not isinstance(body.get("questions"), dict):
            raise ValueError(f"{path}:{number}: each line must be a System One request with state and questions")
        try:
            parse_questions(body["questions"])
        except InvalidRequest as exc:
            raise ValueError(f"{path}:{number}: {exc.message}") from None
        requests.append(
            SuiteRequest(
                id=str(body.get("id", f"line-{number}")), state=body.get("state"), questions=body["questions"],
                images=body.get("images"), videos=body.get("videos"),
            )
        )  # fmt: skip
    if not requests:
        raise ValueError(f"{path}: no requests")
    return requests
