"""What an artifact's manifest says about its numerics, as the lines `export` prints when it writes one and `verify`
prints when it checks one: the smoke parity, the int8 form, the measured choice and its close-call margin."""

from __future__ import annotations

from vllm_sr_runtime.cpu_features import FULL_WEIGHT_BITS, widest_int8_weight_bits


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
    return (
        f"int8: {int8['activations']} activations, {int8.get('weights', 'per output channel')} {int8.get('weight_bits', FULL_WEIGHT_BITS)}-bit weights, "
        f"FP32 choice {int8.get('fp32_choice', 'rule')}{'; ' + rule if rule else ''}"
    )


def saturates_here(manifest: dict) -> bool:
    """Whether this CPU's int8 products overflow on the artifact's weights (x86-64 without VNNI and 8-bit weights)."""
    return manifest.get("dtype") == "int8" and manifest["int8"].get("weight_bits", FULL_WEIGHT_BITS) > widest_int8_weight_bits()


SATURATES_HERE = (
    "this CPU's int8 products saturate on 8-bit weights (x86-64 without VNNI): this artifact is for a host with VNNI or AMX "
    "and is refused here; --int8-weight-bits 7 exports one this host serves"
)


def calibration_source(source: dict) -> str:
    return f" from {source['file']['name']}" if source.get("file") else " (built-in requests)"
