"""Question suites for parity: a deterministic built-in one, or a user JSONL file (one System One request per line)."""

from __future__ import annotations

import random
from typing import Any

from vllm_sr_runtime.request_files import SuiteRequest
from vllm_sr_runtime.synthetic.media import data_url, gradient, moving_square_video, png_bytes

TOPICS = [
    "Write a Python function that merges two sorted lists and explain its running time.",
    "Summarise the attached quarterly report for the board in three bullet points.",
    "My laptop will not boot after the update; the screen stays black. What can I try?",
    "Translate 'where is the train station' into French and German.",
    "Prove that the square root of two is irrational.",
    "Draft a polite email declining a meeting invitation for Friday.",
    "Which of these stocks should I buy tomorrow to double my money?",
    "Explain how a transformer model uses attention, for a high-school student.",
    "Is it safe to mix bleach and ammonia for a stronger cleaner?",
    "Plan a three-day trip to Kyoto on a budget, with vegetarian food.",
]
WORDS = "data model route query budget latency code legal health travel math finance safety creative tone user".split()
LONG_CONTEXT = "\n\nContext:\n"  # opens the filler of the suite's long states
LEVEL_WORDS = ["none", "trivial", "easy", "moderate", "medium", "involved", "hard", "very hard", "expert", "research"]


def _state(rng: random.Random, long_tokens: int | None) -> Any:
    kind = rng.random()
    base = rng.choice(TOPICS)
    if long_tokens:
        filler = " ".join(rng.choice(TOPICS) for _ in range(max(1, long_tokens // 40)))  # ~40 tokens a topic at most
        return f"{base}{LONG_CONTEXT}{filler}"
    if kind < 0.3:
        return {"user": base, "history": [rng.choice(TOPICS) for _ in range(rng.randint(0, 3))], "lang": rng.choice(["en", "de", "fr"])}
    if kind < 0.4:
        return [{"role": "user", "content": base}, {"role": "assistant", "content": rng.choice(TOPICS)}]
    return base


def _choice(rng: random.Random, count: int) -> dict:
    criteria = {}
    for index in range(count):
        key = f"{rng.choice(WORDS)}_{index}" if count <= 40 else f"L{index}"
        terse = count > 40 or rng.random() < 0.2  # wide choices keep short options so they fit the input limit
        criteria[key] = None if terse else f"the request is mostly about {rng.choice(WORDS)} ({index})"
    return {"type": "choice", "instructions": f"Which of the {count} labels fits the request best?", "criteria": criteria}


def _score(rng: random.Random, levels: int) -> dict:
    return {"type": "score", "instructions": "How difficult is the request?", "criteria": LEVEL_WORDS[:levels]}


def _noul(rng: random.Random) -> dict:
    question = {"type": "noul", "instructions": rng.choice(["Does it need multi-step reasoning?", "Is it about code?", "Is the request unsafe?"])}
    if rng.random() < 0.4:
        question["criteria"] = {"true": "yes, clearly", "false": "no"}
    return question


def builtin_suite(max_input_tokens: int, seed: int = 0, media: bool = False) -> list[SuiteRequest]:
    """At least 416 questions: every type, 2..255-option choices (40-option ones included), scores of 2..10
    levels, nouls, text and JSON states, short to near-limit prompts, single- and multi-question requests;
    with `media`, also requests that read an image, two images, a video, and an image with a video."""
    rng = random.Random(seed)
    requests: list[SuiteRequest] = []
    option_counts = [2, 3, 4, 5, 8, 12, 40, 40, 40, 64, 128, 255]
    long_lengths = [max_input_tokens // 8, max_input_tokens // 4, max_input_tokens // 2, int(max_input_tokens * 0.6)]
    index = choices = scores = 0
    while sum(len(r.questions) for r in requests) < 420:
        long_tokens = long_lengths[index % len(long_lengths)] if index % 9 == 4 else None
        questions: dict[str, dict] = {}
        size = 1 if index % 5 == 0 or long_tokens else rng.randint(2, 9)
        for position in range(size):
            kind = (index + position) % 3
            if kind == 0:
                questions[f"c{position}"] = _choice(rng, option_counts[choices % len(option_counts)])
                choices += 1
            elif kind == 1:
                questions[f"s{position}"] = _score(rng, 2 + scores % 9)
                scores += 1
            else:
                questions[f"n{position}"] = _noul(rng)
        requests.append(SuiteRequest(id=f"builtin-{index}", state=_state(rng, long_tokens), questions=questions))
        index += 1
    if media:
        requests += media_requests(rng)
    return requests


SHORT_MAX_OPTIONS = 12


def short_suite(max_input_tokens: int, questions: int = 80) -> list[SuiteRequest]:
    """The built-in suite's short requests (no long context, choices of at most 12 options), in order, until
    `questions` questions: a quick gate at real dimensions (e.g. int8 on a confident package)."""
    requests: list[SuiteRequest] = []
    count = 0
    for request in builtin_suite(max_input_tokens):
        if count >= questions:
            break
        if isinstance(request.state, str) and LONG_CONTEXT in request.state:
            continue
        kept = {qid: q for qid, q in request.questions.items() if q["type"] != "choice" or len(q["criteria"]) <= SHORT_MAX_OPTIONS}
        kept = dict(list(kept.items())[: questions - count])
        if kept:
            requests.append(SuiteRequest(id=request.id, state=request.state, questions=kept))
            count += len(kept)
    return requests


def media_requests(rng: random.Random) -> list[SuiteRequest]:
    """Deterministic synthetic media: gradient images of several sizes and a short clip (PyAV)."""
    images = [data_url("image/png", png_bytes(gradient(width, height, rng.randrange(1 << 30)))) for width, height in ((320, 240), (640, 360), (96, 512))]
    video = data_url("video/mp4", moving_square_video(rng.randrange(1 << 30)))
    ask = {
        "c0": _choice(rng, 4), "n1": _noul(rng), "s2": _score(rng, 5),
        "c3": {"type": "choice", "instructions": "Which object is in the picture?", "criteria": {"cat": None, "dog": None, "car": "a vehicle", "tree": None}},
    }  # fmt: skip
    return [
        SuiteRequest(id="media-image", state="Describe what the user sent.", questions=ask, images=images[:1]),
        SuiteRequest(id="media-two-images", state={"user": "Compare the two pictures."}, questions=ask, images=images[1:]),
        SuiteRequest(id="media-video", state="What happens in the clip?", questions=ask, videos=[video]),
        SuiteRequest(id="media-image-video", state="Does the picture match the clip?", questions=ask, images=images[:1], videos=[video]),
    ]
