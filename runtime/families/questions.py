"""System One questions: parsing and the limits every family shares.

Structural limits (question count, option and level counts, field types, unknown fields) are request
errors (`InvalidRequest`, HTTP 400). Problems of one question's content (duplicate levels, bad noul keys,
a prompt over the input limit, ...) are reported in place by the families (`QuestionError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_sr_runtime.errors import InvalidRequest, QuestionError

MAX_QUESTIONS = 64
MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
QUESTION_TYPES = ("choice", "noul", "score")
QUESTION_FIELDS = {"type", "instructions", "criteria", "choices", "levels"}
NOUL_KEYS = ("false", "true")


def check_state(state: Any) -> None:
    """A request's state: a string, an object, an array, or null (no state)."""
    if not (state is None or isinstance(state, (str, dict, list))):
        raise InvalidRequest("'state' must be a string, object or array")


@dataclass
class Option:
    key: str
    description: Any


@dataclass
class Question:
    id: str
    type: str
    instructions: Any
    options: list[Option]  # choice: its options; noul: false, true; score: "0".."L-1" with the levels
    problem: QuestionError | None = field(default=None)

    @property
    def keys(self) -> list[str]:
        return [option.key for option in self.options]

    @property
    def levels(self) -> list[Any]:
        return [option.description for option in self.options]


def parse_questions(questions: Any) -> list[Question]:
    """Request-order list of questions; raises InvalidRequest for structural errors."""
    if not isinstance(questions, dict) or not questions:
        raise InvalidRequest("questions must be a non-empty object mapping question ids to questions")
    if len(questions) > MAX_QUESTIONS:
        raise InvalidRequest(f"at most {MAX_QUESTIONS} questions per request, got {len(questions)}")
    return [_parse_one(qid, body) for qid, body in questions.items()]


def _parse_one(qid: str, body: Any) -> Question:
    where = f"questions[{qid!r}]"
    if not isinstance(qid, str) or not qid:
        raise InvalidRequest("question ids must be non-empty strings")
    if not isinstance(body, dict):
        raise InvalidRequest(f"{where} must be an object")
    unknown = sorted(set(body) - QUESTION_FIELDS)
    if unknown:
        raise InvalidRequest(f"{where} has unknown field(s): {', '.join(unknown)}")
    kind = body.get("type")
    if kind not in QUESTION_TYPES:
        raise InvalidRequest(f"{where}.type must be one of {', '.join(QUESTION_TYPES)}, got {kind!r}")
    instructions = body.get("instructions")
    if kind == "choice":
        options = _choice_options(where, body)
    elif kind == "noul":
        options = _noul_options(where, body)
    else:
        options = _score_options(where, body)
    question = Question(id=qid, type=kind, instructions=instructions, options=options)
    question.problem = _content_problem(question, body)
    return question


def _choice_options(where: str, body: dict) -> list[Option]:
    if "levels" in body:
        raise InvalidRequest(f"{where}: levels belong to score questions")
    if "choices" in body and "criteria" in body:
        raise InvalidRequest(f"{where}: give criteria or choices, not both")
    if "choices" in body:
        choices = body["choices"]
        if not isinstance(choices, list):
            raise InvalidRequest(f"{where}.choices must be a list of {{key, description}}")
        options = []
        for item in choices:
            if not isinstance(item, dict) or not isinstance(item.get("key"), str) or set(item) - {"key", "description"}:
                raise InvalidRequest(f"{where}.choices entries must be {{key: string, description}}")
            options.append(Option(item["key"], item.get("description")))
    else:
        criteria = body.get("criteria")
        if not isinstance(criteria, dict):
            raise InvalidRequest(f"{where}.criteria must map option keys to descriptions")
        options = [Option(str(key), value) for key, value in criteria.items()]
    if not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
        raise InvalidRequest(f"{where}: a choice needs {MIN_OPTIONS}..{MAX_OPTIONS} options, got {len(options)}")
    return options


def _noul_options(where: str, body: dict) -> list[Option]:
    if "choices" in body or "levels" in body:
        raise InvalidRequest(f"{where}: noul questions take only criteria {{false?, true?}}")
    criteria = body.get("criteria")
    if criteria is None:
        criteria = {}
    if not isinstance(criteria, dict):
        raise InvalidRequest(f"{where}.criteria must be an object with optional keys false and true")
    return [Option(key, criteria.get(key)) for key in NOUL_KEYS]


def _score_options(where: str, body: dict) -> list[Option]:
    if "choices" in body:
        raise InvalidRequest(f"{where}: choices belong to choice questions")
    if "levels" in body and "criteria" in body:
        raise InvalidRequest(f"{where}: give criteria or levels, not both")
    levels = body.get("levels", body.get("criteria"))
    if not isinstance(levels, list):
        raise InvalidRequest(f"{where}: score criteria must be an ordered list of levels")
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
        raise InvalidRequest(f"{where}: a score needs {MIN_LEVELS}..{MAX_LEVELS} levels, got {len(levels)}")
    return [Option(str(index), level) for index, level in enumerate(levels)]


def _content_problem(question: Question, body: dict) -> QuestionError | None:
    def invalid(message: str) -> QuestionError:
        return QuestionError("invalid_question", message)

    if question.type == "choice":
        keys = question.keys
        if any(not key for key in keys):
            return invalid("option keys must be non-empty")
        if len(set(keys)) != len(keys):
            return invalid("option keys must be distinct")
    elif question.type == "noul":
        extra = sorted(set(body.get("criteria") or {}) - set(NOUL_KEYS))
        if extra:
            return invalid(f"noul criteria may only have the keys false and true, got {', '.join(map(str, extra))}")
    else:
        levels = question.levels
        if any(level is None or level == "" or level == {} or level == [] for level in levels):
            return invalid("score levels must be non-empty")
        rendered = [level if isinstance(level, str) else repr(level) for level in levels]
        if len(set(rendered)) != len(rendered):
            return invalid("score levels must be distinct")
    return None
