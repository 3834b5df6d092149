"""`--int8-fp32 measured`: which of a package's int8-quantizable MatMuls stay FP32, chosen from that package's own
first-order sensitivity to int8 rounding.

For every answer row of a few calibration requests, the decision margin is f = log p(top) - log p(runner-up) of
the row's answer (the family's own answer math, differentiated numerically over the output row, so any readout
and calibration is covered). One backward pass from f gives, for each quantizable Linear l (y = x W^T), the
gradient g = df/dy. Int8 rounds W per output channel (step max|W_i| / 127) and x per token (step max|x_r| / 127);
with those rounding errors W_err and x_err computed exactly as the graph rounds, f moves to first order by
d_l = <x_err, g W> + <W_err, g^T x>, and v_l = d_l^2. The Linears' moves are combined as independent (their signs
vary from layer to layer), so a row's predicted spread is sigma = sqrt(sum over quantized l of v_l); a decision
flips when f crosses 0, i.e. when the move exceeds |f|.
Linears are kept FP32, most harmful first (sum over rows of v_l / f^2), until every calibration row's sigma / |f|
is at most the target. With the token embedding table stored as int8 rows (`--int8-embedding int8`), the looked-up
vectors e carry their rows' rounding e_err: d_e = <e_err, df/de> adds to every row's variance whatever is kept, so
the choice keeps what the target then needs, and a table whose term alone passes the target is refused.

Why measured: on d3-lite fixtures of one recipe the sensitivity differs 100x between seeds (`parity
--weight-noise int8`: seed 0 moves 0.0006 median, seed 3 0.08), and within one package it concentrates in the
first layers (seed 3: layer 0 holds 47% of the predicted variance, layers 0-2 76%); a fixed list cannot fit both.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from vllm_sr_runtime.engines.feature_memo import FeatureMemo
from vllm_sr_runtime.engines.torch import forward_with_features
from vllm_sr_runtime.errors import InvalidRequest
from vllm_sr_runtime.export.int8 import NBITS_BLOCK, QMAX, WEIGHT_BITS, split_low_steps, stays_fp32, weight_qmax
from vllm_sr_runtime.export.int8_options import DEFAULT_TARGET
from vllm_sr_runtime.families.answers import NEAR_TIE_MARGIN, answer_distribution
from vllm_sr_runtime.families.base import Family
from vllm_sr_runtime.request_files import load_jsonl

# Peak memory of the measurement per model parameter: the FP32 weights (4 bytes) and the backward's saved
# activations of the eager module, whose transformers Gated DeltaNet fallback keeps many; it grows with the longest
# calibration prompt (d3-lite, 0.75B parameters: 8.9 GiB, 12 bytes per parameter, with the built-in requests; 16.8
# with a 12-turn conversation among them), so the refusal errs on the safe side for a user's file of longer prompts.
CALIBRATION_BYTES_PER_PARAMETER = 18
FINITE_DIFFERENCE_STEP = 1e-4  # relative to the output entry (a probability or a logit)
# The built-in calibration: 30 short questions of every type (text and JSON states, choices of 2-12 options, scores,
# nouls) from the generator of `parity --suite` (the built-in suite's short requests that follow `--suite short`'s 80
# at a 4,094-token limit, so disjoint from them; `tests/test_int8_sensitivity.py` regenerates it). Traffic-like on
# purpose: the target is relative to the calibration answers' margins, and the earlier built-in (the smoke requests
# and a 12-turn conversation, all confident: log margins 5.9-19.7) let a change that flips closer calls pass
# (d3-lite seed 2: 6/80 decisions changed with it, 0/80 with these).
BUILTIN_CALIBRATION_FILE = Path(__file__).with_name("int8_calibration.jsonl")
ROUNDING_FORMS = ("token", "block")  # the int8 forms whose rounding the measurement models
TIER_FORMS = ("block", "split")  # the forms a middle tier between the measured form and FP32 can take


# The built-in calibration's requests (by index) asked again with the family's own sample media, for a package that
# reads images and videos: the vision features fill the first layers' inputs at the placeholders, with magnitudes
# that token embeddings do not have, and int8 rounds them per token like any other row.
BUILTIN_MEDIA_REQUESTS = ((2, "images+video"), (4, "images"))


@dataclass(frozen=True)
class MediaRequest:
    """A calibration request that reads images/videos: data URLs from a request file, or the family's own sample
    media (`sample`: "images" or "images+video") for the built-in calibration."""

    state: Any
    questions: dict
    images: list[str] | None = None
    videos: list[str] | None = None
    sample: str | None = None

    def prepare(self, family: Family) -> Any:
        """The decoded, preprocessed media (`Family.prepare_media`'s form)."""
        if self.sample is not None:
            return family.sample_media(videos=self.sample == "images+video")
        return family.prepare_media(self.images, self.videos)


@dataclass(frozen=True)
class Calibration:
    requests: tuple[tuple[Any, dict], ...]  # (state, questions): text requests
    source: dict  # what artifact.json records: the file (name, sha256) or null for the built-in requests, and counts
    media: tuple[MediaRequest, ...] = ()  # requests that read images/videos (measured after the text ones)

    def prepared_media(self, family: Family) -> Iterator[tuple[Any, dict, Any]]:
        """(state, questions, prepared media) per media request, in order, each prepared as it is reached (a file
        of many large images never holds their pixels at once): what `graph_parity` reads."""
        return ((request.state, request.questions, request.prepare(family)) for request in self.media)


def _calibration(requests: tuple[tuple[Any, dict], ...], file: dict | None, media: tuple[MediaRequest, ...] = ()) -> Calibration:
    questions = sum(len(questions) for _, questions in requests) + sum(len(request.questions) for request in media)
    return Calibration(requests, {"file": file, "requests": len(requests) + len(media), "questions": questions, "media_requests": len(media)}, media)


def builtin_calibration(family: Family | None = None) -> Calibration:
    """The built-in calibration requests (`BUILTIN_CALIBRATION_FILE`); the manifest records them as no file. For a
    `family` that reads images and videos, some of them again with its sample media (`BUILTIN_MEDIA_REQUESTS`)."""
    requests = tuple((request.state, request.questions) for request in load_jsonl(BUILTIN_CALIBRATION_FILE))
    media: tuple[MediaRequest, ...] = ()
    if family is not None and family.reads_media:
        media = tuple(MediaRequest(requests[index][0], requests[index][1], sample=sample) for index, sample in BUILTIN_MEDIA_REQUESTS)
    return _calibration(requests, None, media)


def calibration_requests(path: Path) -> Calibration:
    """A JSONL request file (`parity --suite`'s format) to calibrate on: requests like the traffic the model will
    serve. Requests with images/videos (for a package with a vision tower) run the vision tower in FP32, as the
    artifact's vision graph does, and measure the text tower's Linears on the rows its features fill."""
    path = Path(path)
    requests = load_jsonl(path)
    text = tuple((request.state, request.questions) for request in requests if not (request.images or request.videos))
    media = tuple(MediaRequest(request.state, request.questions, request.images, request.videos) for request in requests if request.images or request.videos)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return _calibration(text, {"name": path.name, "sha256": digest}, media)


def check_calibration(family: Family, calibration: Calibration) -> None:
    """Every calibration question renders for this family, and every request's media decodes for it (checked
    before the export does any work)."""
    for number, (state, questions) in enumerate(calibration.requests, start=1):
        _check_request(family, f"int8 calibration request {number}", state, questions, lambda: None)
    for number, request in enumerate(calibration.media, start=1):
        _check_request(family, f"int8 calibration request {number} with media", request.state, request.questions, lambda: request.prepare(family))


def _check_request(family: Family, name: str, state: Any, questions: dict, prepare_media: Callable[[], Any]) -> None:
    try:  # the media are decoded inside: a file's undecodable image is refused as its request
        errors = family.plan(state, questions, media=prepare_media()).errors
    except InvalidRequest as exc:
        raise ValueError(f"{name}: {exc}") from None
    if errors:
        problems = "; ".join(f"{qid}: {answer['message']}" for qid, answer in errors.items())
        raise ValueError(f"{name}: {problems}")


@dataclass
class Sensitivity:
    names: list[str]  # the quantizable Linears' weight names
    macs: np.ndarray  # [linears] multiply-accumulates per token
    variance: np.ndarray  # [rows, linears] predicted variance of each row's margin from quantizing each Linear
    margins: np.ndarray  # [rows] |log p(top) - log p(runner-up)|
    # [rows, linears] the same with the Linear in the middle tier's form (`tier_form`: `block`, MatMulNBits, or
    # `split`, two int8 halves), measured in the same pass where asked (`measure(tier=...)`): what moving a sensitive
    # Linear there instead of FP32 leaves
    tier_variance: np.ndarray | None = None
    tier_form: str | None = None
    # every calibration question's eager answer (its probability per option), in the requests' order, near-ties
    # included: the reference the finished graph is checked against without running the eager model again
    answers: list[list[float] | None] = field(default_factory=list)
    # [rows] the predicted variance of each row's margin from what int8 rounds whatever the choice keeps: the token
    # embedding tables stored as int8 rows (`measure(embedding_tables=...)`); None: nothing
    fixed_variance: np.ndarray | None = None

    def spread(self, kept: Iterable[str] = ()) -> np.ndarray:
        """Each row's predicted sigma / |margin| with the `kept` Linears FP32."""
        kept = set(kept)
        return self.spread_of(np.array([name not in kept for name in self.names], dtype=bool))

    def fixed_spread(self) -> float | None:
        """The largest predicted sigma / |margin| of what no choice keeps FP32 (the int8 embedding tables), or None."""
        return None if self.fixed_variance is None else float((np.sqrt(self.fixed_variance) / self.margins).max())

    def spread_of(self, quantized: np.ndarray, tiered: np.ndarray | None = None) -> np.ndarray:
        """Each row's predicted sigma / |margin| with only the Linears the boolean mask `quantized` marks in int8
        (those `tiered` marks in the middle tier's form, the others in the measured form)."""
        variance = self.variance[:, quantized].sum(axis=1)
        if self.fixed_variance is not None:
            variance = variance + self.fixed_variance
        if tiered is not None and tiered.any():
            variance = variance + self.tier_variance[:, tiered].sum(axis=1)
        return np.sqrt(variance) / self.margins


def quantizable_linears(module: torch.nn.Module, quantized_towers: tuple[str, ...]) -> dict[str, torch.nn.Linear]:
    """The Linears whose weights int8 quantizes (the same rule as the graph rewrite), by weight name."""
    return {
        f"{name}.weight": layer
        for name, layer in module.named_modules()
        if isinstance(layer, torch.nn.Linear) and ".lora_" not in f".{name}" and not stays_fp32(f"{name}.weight", quantized_towers)
    }


def measure(
    family: Family, module: torch.nn.Module, requests: list[tuple[Any, dict]], progress: bool = False, form: str = "token", tier: str | None = None,
    weight_bits: int = WEIGHT_BITS, embedding_tables: tuple[str, ...] = (), media_requests: Sequence[MediaRequest] = (),
) -> Sensitivity:
    """First-order int8 sensitivity of every quantizable Linear of the eager FP32 `module`, on every answer row
    of `requests` ((state, questions) pairs) that is not a near-tie, with the rounding of the int8 `form` (`token`
    or `block`), and with a `tier` form (`block` or `split`) that of that form too (`tier_variance`, for
    `choose_tiers`); the integer products' weights at `weight_bits` (the block form's stay at 8); `progress`: a
    bar over the questions (each costs one forward and one backward pass: ~12 s at 0.75B parameters on 2 cores).
    `embedding_tables`: the token embedding weights stored as int8 rows (`--int8-embedding int8`); each looked-up
    vector carries its row's rounding whatever the choice keeps FP32, measured the same way into `fixed_variance`.
    `media_requests`: measured after `requests` (each request's media prepared as it is reached), their rows through
    the module's forward_features with the vision tower's features computed without gradients (its graph stays FP32)."""
    if form not in ROUNDING_FORMS:
        raise ValueError(f"int8 sensitivity is measured for the {' or '.join(ROUNDING_FORMS)} forms, not {form!r}")
    if tier is not None and tier not in TIER_FORMS:
        raise ValueError(f"an int8 middle tier is one of the {' or '.join(TIER_FORMS)} forms, not {tier!r}")
    linears = quantizable_linears(module, family.export_spec.quantized_towers)
    if not linears:
        raise ValueError(f"{family.model_name} has no Linear that int8 quantizes")
    names = list(linears)
    tables = table_embeddings(module, embedding_tables)
    captured: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    looked_up: list[torch.Tensor] = []  # every vector the int8 tables returned in this pass
    hooks = [layer.register_forward_hook(lambda _, args, out, key=key: captured.__setitem__(key, (args[0], out))) for key, layer in linears.items()]
    hooks += [table.register_forward_hook(lambda _, args, out: looked_up.append(out)) for table in tables]
    flags = {parameter: parameter.requires_grad for parameter in module.parameters()}
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    for layer in [*linears.values(), *tables]:
        layer.weight.requires_grad_(True)  # so every Linear's output is in the autograd graph; no weight gradient is asked for
    rows: list[np.ndarray] = []
    tier_rows: list[np.ndarray] = []
    margins: list[float] = []
    fixed: list[float] = []
    answers: list[list[float] | None] = []
    everything = [(state, questions, lambda: None) for state, questions in requests] + [(request.state, request.questions, functools.partial(request.prepare, family)) for request in media_requests]
    memo = FeatureMemo(family.media_modalities)
    bar = tqdm(total=sum(len(questions) for _, questions, _ in everything), desc="calibration questions", unit="question", leave=False, disable=not progress)
    try:
        for state, questions, prepare in everything:
            media = prepare()
            for key, question in questions.items():  # one row per pass: the backward holds one row's activations
                bar.update()
                (batch,) = family.plan(state, {key: question}, media=media).batches
                captured.clear()
                looked_up.clear()
                with torch.enable_grad():
                    output = _forward(family, module, batch, memo)[0]
                    row = output.detach().float().numpy().astype(np.float64)
                    answers.append(answer_distribution(family.answer(batch.items[0], row)))
                    direction, margin = _margin_direction(family, batch.items[0], row, answers[-1])
                    if direction is None:
                        continue
                    target = (output.float() * torch.from_numpy(direction)).sum()
                    # the vision tower runs without gradients (its graph stays FP32): a Linear there is unreached too
                    if unreached := [name for name in names if name not in captured or not captured[name][1].requires_grad]:
                        raise ValueError(
                            f"int8 calibration: {len(unreached)} Linear(s) of the quantized towers {family.export_spec.quantized_towers} did not run in a "
                            f"calibration question's text pass, so their rounding cannot be measured (first: {unreached[0]}); a tower outside the text pass must stay out of the family's ExportSpec.quantized_towers"
                        )
                    gradients = torch.autograd.grad(target, [*(captured[name][1] for name in names), *looked_up])
                gradients, table_gradients = gradients[: len(names)], gradients[len(names) :]
                if tables:  # a looked-up vector is its table row: rounded per row, as quantize_embeddings stores it
                    change = sum(
                        (_rounding_error(vectors.detach().reshape(-1, vectors.shape[-1]).float(), None) * g.reshape(-1, g.shape[-1]).float()).sum(dtype=torch.float64)
                        for vectors, g in zip(looked_up, table_gradients)
                    )  # fmt: skip
                    fixed.append(float(change) ** 2)
                forms = (form, tier) if tier else (form,)
                variances = np.array([_variances(captured[name][0].detach(), g, linears[name].weight.detach(), forms, weight_bits) for name, g in zip(names, gradients)])
                rows.append(variances[:, 0])
                if tier:
                    tier_rows.append(variances[:, 1])
                margins.append(margin)
                del output, gradients, table_gradients
    finally:
        bar.close()
        for hook in hooks:
            hook.remove()
        for parameter, flag in flags.items():
            parameter.requires_grad_(flag)
        captured.clear()
        looked_up.clear()
    if not rows:
        raise ValueError("int8 calibration: every calibration answer is a near-tie; no margin to protect")
    macs = np.array([linears[key].weight.numel() for key in names], dtype=np.float64)
    return Sensitivity(
        names, macs, np.stack(rows), np.array(margins), answers=answers, tier_variance=np.stack(tier_rows) if tier else None, tier_form=tier,
        fixed_variance=np.array(fixed) if tables else None,
    )  # fmt: skip


def _forward(family: Family, module: torch.nn.Module, batch: Any, memo: FeatureMemo) -> torch.Tensor:
    """The module's output for one batch: the token-id forward, or for rows that read media the eager engine's
    forward over the vision tower's features (the tower without gradients, once per request's pixels)."""
    if not batch.media:
        return module(**_tensors(batch.inputs, family.input_names))
    return forward_with_features(module, batch.inputs, memo, _tensors)


def _tensors(inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(np.ascontiguousarray(inputs[name])) for name in names}


def table_embeddings(module: torch.nn.Module, embedding_tables: tuple[str, ...]) -> list[torch.nn.Embedding]:
    """The Embedding modules whose weights `embedding_tables` names (refused where one names none)."""
    found = {f"{name}.weight": layer for name, layer in module.named_modules() if isinstance(layer, torch.nn.Embedding) and f"{name}.weight" in embedding_tables}
    if missing := [name for name in embedding_tables if name not in found]:
        raise ValueError(f"int8 embedding tables not found as Embedding modules: {', '.join(missing)}")
    return list(found.values())


def choose(sensitivity: Sensitivity, target: float = DEFAULT_TARGET) -> list[str]:
    """The fewest Linears (most harmful first, greedily) to keep FP32 so that every row's predicted spread is at
    most `target` times its margin."""
    remaining = np.ones(len(sensitivity.names), dtype=bool)
    kept: list[str] = []
    harm = (sensitivity.variance / sensitivity.margins[:, None] ** 2).sum(axis=0)
    while remaining.any() and sensitivity.spread_of(remaining).max() > target:
        worst = int(np.argmax(np.where(remaining, harm, -1.0)))
        remaining[worst] = False
        kept.append(sensitivity.names[worst])
    return kept


def choose_tiers(sensitivity: Sensitivity, target: float = DEFAULT_TARGET) -> tuple[list[str], list[str]]:
    """(kept FP32, moved to the middle tier's form): the most harmful Linears (greedily) move to the tier's form
    (`block` or `split`) until every row's predicted spread is at most `target` times its margin; where all of them
    in that form still miss it, the most harmful of those stay FP32 instead, and then every tiered Linear the target
    no longer needs goes back to the measured form (least harmful first)."""
    count = len(sensitivity.names)
    quantized, blocked = np.ones(count, dtype=bool), np.zeros(count, dtype=bool)
    harm = (sensitivity.variance / sensitivity.margins[:, None] ** 2).sum(axis=0)
    block_harm = (sensitivity.tier_variance / sensitivity.margins[:, None] ** 2).sum(axis=0)
    order: list[int] = []
    while (quantized & ~blocked).any() and sensitivity.spread_of(quantized & ~blocked, blocked).max() > target:
        worst = int(np.argmax(np.where(quantized & ~blocked, harm, -1.0)))
        blocked[worst] = True
        order.append(worst)
    kept: list[str] = []
    while blocked.any() and sensitivity.spread_of(quantized & ~blocked, blocked).max() > target:
        worst = int(np.argmax(np.where(blocked, block_harm, -1.0)))
        blocked[worst], quantized[worst] = False, False
        kept.append(sensitivity.names[worst])
    for index in reversed(order):
        if blocked[index]:
            blocked[index] = False
            if sensitivity.spread_of(quantized & ~blocked, blocked).max() > target:
                blocked[index] = True
    return kept, [sensitivity.names[index] for index in order if blocked[index]]


def summary(sensitivity: Sensitivity, kept: list[str], target: float, tiered: list[str] = ()) -> dict:
    """What the manifest records of the choice (`tiered`: the Linears moved to the middle tier's form)."""
    before = sensitivity.spread()
    kept_set, blocked_set = set(kept), set(tiered)
    blocked_mask = np.array([name in blocked_set for name in sensitivity.names], dtype=bool)
    quantized_mask = np.array([name not in kept_set for name in sensitivity.names], dtype=bool) & ~blocked_mask
    after = sensitivity.spread_of(quantized_mask, blocked_mask)

    def share(names: set) -> float:
        return round(float(sum(m for name, m in zip(sensitivity.names, sensitivity.macs) if name in names) / sensitivity.macs.sum()), 4)

    return {
        "target": target,
        "rows": len(sensitivity.margins),
        "kept": kept,
        "kept_share_of_quantizable_macs": share(kept_set),
        # moved to the block form (MatMulNBits) or the split form (two int8 halves) instead of FP32
        "blocked": list(tiered) if sensitivity.tier_form == "block" else [],
        "blocked_share_of_quantizable_macs": share(blocked_set) if sensitivity.tier_form == "block" else 0.0,
        "split": list(tiered) if sensitivity.tier_form == "split" else [],
        "split_share_of_quantizable_macs": share(blocked_set) if sensitivity.tier_form == "split" else 0.0,
        "predicted_spread_all_int8": round(float(before.max()), 4),
        "predicted_spread_chosen": round(float(after.max()), 4),
        # what the int8 embedding table alone moves (None: the table stays FP32); no choice of Linears lowers it
        "predicted_spread_embedding": None if sensitivity.fixed_variance is None else round(sensitivity.fixed_spread(), 4),
        "answers": [
            {"margin": round(float(margin), 4), "predicted_change_all_int8": round(float(b * margin), 5), "predicted_change_chosen": round(float(a * margin), 5)}
            for margin, b, a in zip(sensitivity.margins, before, after)
        ],  # per calibration answer: its log-margin and the predicted change of it (first order, |.|)
    }


def _rounding_error(values: torch.Tensor, block: int | None, split_steps: int | None = None, qmax: int = QMAX) -> torch.Tensor:
    """What symmetric int8 rounding into [-qmax, qmax] adds to each row of a 2-D tensor: one step per row (max |row| /
    qmax), or one per row and block of `block` columns (a last partial block padded with zeros), as the int8 graph
    rounds it; with `split_steps`, what is left after the split form's low half (the residual rounded again in steps
    that many times finer, into [-split_steps / 2, split_steps / 2])."""
    rows, columns = values.shape
    if block is None:
        grouped = values.unsqueeze(1)
    else:
        padded = values if columns % block == 0 else torch.nn.functional.pad(values, (0, -columns % block))
        grouped = padded.reshape(rows, -1, block)
    steps = (grouped.abs().amax(dim=2, keepdim=True) / qmax).clamp_min(torch.finfo(torch.float32).tiny)
    error = torch.round(grouped / steps).clamp_(-qmax, qmax).mul_(steps).sub_(grouped)
    if split_steps:  # the low half holds -error to a step of steps / split_steps
        low_steps, low_max = steps / split_steps, split_steps // 2
        error = error + torch.round(-error / low_steps).clamp_(-low_max, low_max).mul_(low_steps)
    return error.reshape(rows, -1)[:, :columns]


def _variances(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, forms: tuple[str, ...] = ("token",), weight_bits: int = WEIGHT_BITS) -> list[float]:
    """The squared first-order change of the margin when one Linear runs in int8, in each of the `forms`: its input
    x [.., tokens, in] and its weight [out, in] rounded as the graph rounds them (`token`: x per token, the weight
    per output channel; `block`: both per row and block of NBITS_BLOCK inputs), against the margin's gradient g at
    its output [.., tokens, out]. The integer products' weights round at `weight_bits` (the block form's at 8)."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    g2 = g.reshape(-1, g.shape[-1]).float()
    w = weight.float()
    through_weight, through_input = g2 @ w, g2.T @ x2  # shared by the forms
    changes = []
    for form in forms:
        block = NBITS_BLOCK if form == "block" else None
        w_qmax = QMAX if form == "block" else weight_qmax(weight_bits)
        split_steps = split_low_steps(w_qmax) if form == "split" else None
        # <g, x_error W^T> + <g, x W_error^T> = <x_error, g W> + <W_error, g^T x>
        change = (_rounding_error(x2, block, split_steps) * through_weight).sum(dtype=torch.float64) + (_rounding_error(w, block, split_steps, w_qmax) * through_input).sum(dtype=torch.float64)
        changes.append(float(change) ** 2)
    return changes


def _margin_direction(family: Family, item: Any, row: np.ndarray, reference: list[float] | None) -> tuple[np.ndarray | None, float]:
    """The gradient of the answer's log-margin (top vs runner-up) over the output row (float64), by central
    differences of the family's answer math, and the margin; `reference` is the row's answer distribution. (None, 0)
    for near-ties and single-option rows."""
    if reference is None or len(reference) < 2:
        return None, 0.0
    order = np.argsort(reference)[::-1]
    top, second = int(order[0]), int(order[1])
    if reference[top] - reference[second] < NEAR_TIE_MARGIN or reference[second] <= 0:
        return None, 0.0

    def log_margin(values: np.ndarray) -> float:
        distribution = answer_distribution(family.answer(item, values))
        return math.log(distribution[top]) - math.log(distribution[second])

    direction = np.zeros(row.shape, dtype=np.float32)
    for index in range(min(len(item.question.options), len(row))):  # an answer reads its options' entries only
        if not np.isfinite(row[index]):
            continue
        step = FINITE_DIFFERENCE_STEP * (abs(float(row[index])) or 1.0)
        up, down = row.copy(), row.copy()
        up[index] += step
        down[index] -= step
        try:
            direction[index] = (log_margin(up) - log_margin(down)) / (2 * step)
        except ValueError:  # the step left the answer's domain (a zero probability stepped below zero)
            continue
    return direction, log_margin(row)
