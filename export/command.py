"""`vllm-sr-runtime export PACKAGE --out DIR [--variant contrib|portable] [--dtype fp32|fp16|bf16|int8] [--opset N] [--shared-context]
[--lengths 128,512,...]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_sr_runtime.cli_options import add_quiet_option, add_source_options
from vllm_sr_runtime.cli_values import counts, ranged
from vllm_sr_runtime.export.export_options import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, SUPPORTED_DTYPES, VARIANTS
from vllm_sr_runtime.export.int8_options import ACTIVATION_FORMS, DEFAULT_TARGET, EMBEDDING_CHOICES, INT8_FP32_CHOICES, INT8_SENSITIVE_CHOICES, MOSTLY_FP32_SHARE, WEIGHT_BITS_CHOICES


# The int8 options and their defaults: given with another --dtype they would do nothing, so they are refused.
INT8_DEFAULTS = {
    "int8_activations": ACTIVATION_FORMS[0], "int8_sensitive": INT8_SENSITIVE_CHOICES[0], "int8_fp32": INT8_FP32_CHOICES[0],
    "int8_target": DEFAULT_TARGET, "int8_weight_bits": WEIGHT_BITS_CHOICES[0], "int8_embedding": EMBEDDING_CHOICES[0],
}  # fmt: skip


def int8_options(args: argparse.Namespace) -> dict:
    given = [name for name in INT8_DEFAULTS if getattr(args, name) is not None]
    if given and args.dtype != "int8":
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags}: for --dtype int8 only (this export is {args.dtype})")
    return {name: default if getattr(args, name) is None else getattr(args, name) for name, default in INT8_DEFAULTS.items()}


def run(args: argparse.Namespace) -> int:
    from vllm_sr_runtime.artifact_summary import SATURATES_HERE, builtin_calibration_hint, measured_int8_lines, saturates_here, smoke_line
    from vllm_sr_runtime.cpu_features import FULL_WEIGHT_BITS
    from vllm_sr_runtime.export.exporter import export_package

    int8 = int8_options(args)
    manifest = export_package(
        args.package,
        args.out,
        variant=args.variant,
        dtype=args.dtype,
        opset=args.opset,
        base_path=args.base_path,
        cache_dir=args.cache_dir,
        offline=args.offline or None,
        progress=not args.quiet,
        shared_context=args.shared_context,
        smoke=args.smoke,
        lengths=tuple(args.lengths) if args.lengths else None,
        int8_calibration=Path(args.int8_calibration) if args.int8_calibration else None,
        **int8,
    )
    ops = sum(manifest["op_counts"].values())
    print(f"ok: {args.out} ({manifest['variant']}/{manifest['dtype']}, opset {manifest['opset']}, {ops} nodes, domains {','.join(manifest['op_domains'])}); {smoke_line(manifest)}")
    if manifest["dtype"] == "int8" and manifest["int8"]["measured"]:
        measured = manifest["int8"]["measured"]
        for line in measured_int8_lines(measured):
            print(line)
        if hint := builtin_calibration_hint(measured["calibration"]):
            print(hint)
        if measured["kept_share_of_quantizable_macs"] >= MOSTLY_FP32_SHARE:
            print(
                f"int8 keeps {measured['kept_share_of_quantizable_macs']:.0%} of the quantizable multiply-adds FP32: this package is sensitive to "
                f"{manifest['int8'].get('weight_bits', FULL_WEIGHT_BITS)}-bit rounding, so this artifact runs not far from --dtype fp32's speed; compare both with `vllm-sr-runtime bench`, and "
                "with --int8-sensitive split (those MatMuls as two int8 halves each: faster where int8 products run far above fp32's, as with AMX; no faster on an AVX-512 VNNI host)"
            )
    if manifest["dtype"] == "int8":
        bits = manifest["int8"].get("weight_bits", FULL_WEIGHT_BITS)
        print(
            f"int8 ({manifest['int8']['activations']} activations, {bits}-bit weights): not established as answering like exact on every package "
            "(on confident synthetic d3-lite packages it changes more than 1% of decisions); judge this model with "
            "`vllm-sr-runtime parity`, which gates int8 at 1% of decisions by default, before serving it "
            f"(`parity --profile exact --weight-noise int8{' --weight-noise-factor 2' if bits == 7 else ''}` tells whether the package tolerates any {bits}-bit weights)"
        )
        if saturates_here(manifest):
            print(SATURATES_HERE)
    buckets = manifest.get("buckets")
    if buckets:
        lengths = ", ".join(str(graph["length"]) for graph in buckets["graphs"])
        print(f"static-length graphs: {lengths} tokens (rows padded on the {buckets['padding']['side']}); every node in the MIGraphX provider's list")
    shared = manifest.get("shared_context")
    if shared:
        smoked = f"; smoke parity max |dp| {shared['smoke_parity']['max_abs_diff']:.2e}" if shared["smoke_parity"] else ""
        print(f"shared_context graph: {shared['model_file']} ({shared['weights_from_main']} weights read from the main graph's file){smoked}")
    media = manifest.get("media")
    if media:
        smoked = ""
        if media["smoke_parity"]:
            smoked = f"; smoke parity on images and video max |dp| {max(r['max_abs_diff'] for r in media['smoke_parity'].values()):.2e}"
        print(
            f"media graphs: {media['vision']['model_file']} (vision tower, per attention segment) and {media['text']['model_file']} "
            f"({media['text']['weights_from_main']} weights read from the main graph's file){smoked}"
        )
    for row in manifest["export"]["phases"]:
        peak = f"{row['peak_rss_bytes'] / 2**20:,.0f} MiB" if row["peak_rss_bytes"] else "-"
        print(f"  phase {row['name']:18} {row['seconds']:8.1f} s   peak RSS {peak}")
    return 0


def register(sub) -> None:
    parser = sub.add_parser("export", help="export a verified package to an ONNX artifact (readout inside)")
    parser.add_argument("package", help="PATH, REPO (a pinned release) or REPO@REV")
    parser.add_argument("--out", required=True, help="artifact directory (written atomically)")
    parser.add_argument("--variant", default="contrib", choices=VARIANTS, help="contrib: com.microsoft fused GDN ops; portable: standard ops only, one static-length graph per --lengths (MIGraphX)")
    parser.add_argument("--dtype", default="fp32", choices=list(SUPPORTED_DTYPES), help="the graph's numerics (fp32 is the reference; others are gated by smoke parity)")
    parser.add_argument("--opset", type=ranged(int, MIN_OPSET, MAX_OPSET), default=DEFAULT_OPSET, help=f"ONNX opset of the graph (default {DEFAULT_OPSET})")
    parser.add_argument(
        "--shared-context", action="store_true",
        help="also export the shared_context graph (a request's common prefix once, its questions continue from it)",
    )  # fmt: skip
    parser.add_argument(
        "--smoke", default="auto", choices=["auto", "on", "off"],
        help="smoke parity against eager (fp32 within 1e-4, decisions unchanged); auto: when the eager model and one ORT session fit in free memory",
    )  # fmt: skip
    parser.add_argument(
        "--lengths", metavar="N,N,...", type=counts,
        help="portable: the static sequence lengths, one graph each (multiples of 64; default powers of two from 128 to the "
        "package's longest prompt, which always gets one). Each graph is compiled, and holds its weights, on MIGraphX",
    )  # fmt: skip
    parser.add_argument(
        "--int8-activations", choices=ACTIVATION_FORMS,
        help="--dtype int8: one activation scale per token (default; robust to outlier tokens), per tensor (ORT quantize_dynamic's "
        "form) or per block (ORT's MatMulNBits at 8 bits: weights and activations per block of 32 inputs; robust to outlier "
        "channels, slower than per token)",
    )  # fmt: skip
    parser.add_argument(
        "--int8-sensitive", choices=INT8_SENSITIVE_CHOICES,
        help="with per-token activations: where the MatMuls the measurement (--int8-fp32 measured) finds most harmful go: "
        "fp32 (default), first the block form (FP32 only where that still misses --int8-target; measured no faster on "
        "an AVX-512 VNNI host), or first the split form, two int8 halves of weight and activation (~15 bits, two integer "
        "products; FP32 only where that still misses the target), which the fixed rule's FP32 projections then take too: "
        "faster than FP32 where int8 products run far above fp32's, as with AMX; measured no faster on an AVX-512 VNNI host",
    )  # fmt: skip
    parser.add_argument(
        "--int8-fp32", choices=INT8_FP32_CHOICES,
        help="--dtype int8: which MatMuls stay FP32 besides the fixed rule's (token mixers' output projections, GDN gate inputs): "
        "measured (default; this package's first-order sensitivity on calibration requests picks the most harmful ones, "
        "until --int8-target holds) or rule (none)",
    )  # fmt: skip
    parser.add_argument(
        "--int8-target", type=float, metavar="F",
        help="--int8-fp32 measured: keep MatMuls FP32 until every calibration answer's predicted margin change from int8 is "
        f"at most F times its margin (default {DEFAULT_TARGET}; smaller keeps more FP32)",
    )  # fmt: skip
    parser.add_argument(
        "--int8-calibration", metavar="FILE.jsonl",
        help="--int8-fp32 measured: measure on these requests (one System One request per line, as `parity --suite` reads; "
        "with images/videos for a package with a vision tower) instead of the built-in ones: requests like the traffic the model will serve",
    )  # fmt: skip
    parser.add_argument(
        "--int8-weight-bits", type=int, choices=WEIGHT_BITS_CHOICES,
        help="--dtype int8: bits of the weights the integer products read: 8 (default), or 7 for x86 hosts without VNNI "
        "(AVX2, or AVX-512 without AVX512_VNNI), where ONNX Runtime's int8 kernel sums byte products in saturating 16 bits "
        "that 8-bit weights overflow: an 8-bit artifact is refused there (`serve`, `parity`, and this export's smoke parity)",
    )  # fmt: skip
    parser.add_argument(
        "--int8-embedding", choices=EMBEDDING_CHOICES,
        help="--dtype int8: the token embedding table fp32 (default) or int8 with one scale per row (a quarter of its bytes: "
        "most of an int8 artifact's; each token's vector then carries its row's rounding: --int8-fp32 measured counts it and "
        "refuses the table where it alone misses --int8-target; judge it with `parity`)",
    )  # fmt: skip
    add_source_options(parser)
    add_quiet_option(parser)
    parser.set_defaults(func=run)
