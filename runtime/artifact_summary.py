"""What an artifact's manifest says about its numerics, as the lines `export` prints when it writes one and `verify`
prints when it checks one: the smoke parity, the int8 form, the measured choice and its close-call margin."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple

from vllm_sr_runtime.cpu_features import FULL_WEIGHT_BITS, widest_int8_weight_bits

# The element type most of a graph's weight bytes must have for the dtype an artifact claims (an "fp16" graph that
# holds FP32 weights is the published-artifact complaint this catches); int8 graphs keep the embedding table, the
# head and the projections the rule or the measurement names FP32, so they only need integer weights at all.
CLAIMED_TYPES = {"fp32": ("FLOAT",), "fp16": ("FLOAT16",), "bf16": ("BFLOAT16",)}
INTEGER_TYPES = ("INT8", "UINT8", "INT4", "UINT4")


def smoke_line(manifest: dict) -> str:
    smoke = manifest.get("smoke_parity")
    if smoke:
        return f"smoke parity max |dp| {smoke['max_abs_diff']:.2e}, {smoke['decisions_changed']}/{smoke['questions']} decisions changed"
    reason = (manifest.get("smoke") or {}).get("reason", "not recorded")
    return f"no smoke parity ({reason}): judge it with `vllm-sr-runtime parity`"


def measured_int8_lines(measured: dict) -> list[str]:
    """The measured choice (`int8.measured`): what stayed FP32 or went to the block or split form, and how the finished
    graph answered the calibration questions, with the close-call margin that keeps their decisions exact's."""
    lines = [
        f"int8 measured on {measured['rows']} calibration answers{calibration_source(measured['calibration'])}: {len(measured['kept'])} MatMuls kept FP32 "
        f"({measured['kept_share_of_quantizable_macs']:.0%} of the quantizable multiply-adds), {len(measured['blocked'])} in the block form "
        f"({measured['blocked_share_of_quantizable_macs']:.0%}), {len(measured['split'])} in the split form ({measured['split_share_of_quantizable_macs']:.0%}); predicted margin spread "
        f"{measured['predicted_spread_all_int8']:.3g} -> {measured['predicted_spread_chosen']:.3g} of the margin (target {measured['target']})"
        + (f"; the int8 embedding table alone: {embedding:.3g} (included in both)" if (embedding := measured.get("predicted_spread_embedding")) is not None else "")
    ]
    checked = measured["calibration_parity"]  # None where the export opened no CPU session
    if checked:
        lines.append(
            f"int8 graph on the calibration questions: {checked['decisions_changed']}/{checked['questions']} decisions changed "
            f"({checked['decisions_changed_beyond_near_ties']} where exact chose by more than a near-tie), max |dp| {checked['max_abs_diff']:.3g}"
        )
        if checked["close_call_margin"]:
            lines.append(
                f"close calls: a decision can change only where int8's top-two margin is at most 2 x its max |dp|; `serve --close-call-margin "
                f"{checked['close_call_margin']:.2g}` answers those (on traffic that int8 moves no more than the calibration questions) with exact; "
                "`--close-call-margin artifact` reads this margin from artifact.json"
            )
    return lines


def int8_form_line(manifest: dict) -> str:
    """The int8 form: activations, weight width, what chose the FP32 MatMuls, and the fixed rule's weights (by name)
    kept FP32 or in the split form."""
    int8 = manifest["int8"]
    rule = f"FP32: {', '.join(int8['kept_fp32'])}" if int8.get("kept_fp32") else ""
    if int8.get("split"):
        rule = f"split form: {', '.join(int8['split'])}"
    embedding = (int8.get("embedding") or {}).get("form", "fp32")
    return (
        f"int8: {int8['activations']} activations, {int8.get('weights', 'per output channel')} {int8.get('weight_bits', FULL_WEIGHT_BITS)}-bit weights, "
        f"FP32 choice {int8.get('fp32_choice', 'rule')}{'; ' + rule if rule else ''}; embedding table {embedding}"
    )


def saturates_here(manifest: dict) -> bool:
    """Whether this CPU's int8 products overflow on the artifact's weights (x86-64 without VNNI and 8-bit weights)."""
    return manifest.get("dtype") == "int8" and manifest["int8"].get("weight_bits", FULL_WEIGHT_BITS) > widest_int8_weight_bits()


SATURATES_HERE = (
    "this CPU's int8 products saturate on 8-bit weights (x86-64 without VNNI): this artifact is for a host with VNNI or AMX "
    "and is refused here; --int8-weight-bits 7 exports one this host serves"
)


def calibration_source(source: dict) -> str:
    media = f"; {source['media_requests']} of {source['requests']} requests with images/videos" if source.get("media_requests") else ""
    return f" from {source['file']['name']}{media}" if source.get("file") else f" (built-in requests{media})"


def builtin_calibration_hint(source: dict) -> str | None:
    """What `export` says of a measured int8 choice calibrated on the built-in requests (None for a user's file)."""
    if source.get("file"):
        return None
    media = source.get("media_requests")
    return (
        "int8 calibrated on the built-in requests (generic short questions of every type"
        + (f"; {media} of those requests asked again with the family's random-pixel sample media" if media else "")
        + "): the target protects answers as close as theirs; --int8-calibration FILE.jsonl measures on requests like your traffic"
        + (" (images and videos as data URLs included)" if media else "")
    )


class WeightBytes(NamedTuple):
    """A graph's initializer bytes by ONNX element type name: all of them, and its matrices alone (two dimensions or
    more: weights and tables, not scales, zero points or norms)."""

    all: Counter
    matrices: Counter


def weight_bytes_by_type(graph: Path) -> WeightBytes:
    """Read from the graph alone, in one pass (external data by its recorded length; the weights file is not read)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    every: Counter = Counter()
    matrices: Counter = Counter()
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            size = int({entry.key: entry.value for entry in tensor.external_data}.get("length", 0))
        else:
            size = len(tensor.raw_data) if tensor.HasField("raw_data") else onnx.numpy_helper.to_array(tensor).nbytes
        name = onnx.TensorProto.DataType.Name(tensor.data_type)
        every[name] += size
        if len(tensor.dims) >= 2:
            matrices[name] += size
    return WeightBytes(every, matrices)


def weights_line(sizes: Counter) -> str:
    total = sum(sizes.values()) or 1
    parts = ", ".join(f"{name.lower()} {size:,} bytes ({size / total:.0%})" for name, size in sizes.most_common() if size)
    return f"weights of the main graph: {parts}"


def claim_mismatch(dtype: str, sizes: Counter) -> str | None:
    """Why the graph's weight matrices (`weight_bytes_by_type(graph).matrices`) are not what the artifact's
    dtype claims, or None."""
    total = sum(sizes.values())
    if not total:
        return None
    if dtype == "int8":
        return None if any(sizes[name] for name in INTEGER_TYPES) else "it claims int8 and holds no integer weights"
    expected = CLAIMED_TYPES.get(dtype)
    if expected is None:
        return None
    share = sum(sizes[name] for name in expected) / total
    return None if share > 0.5 else f"it claims {dtype} and only {share:.0%} of its weight bytes are {'/'.join(name.lower() for name in expected)}"
