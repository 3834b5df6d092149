"""`vllm-sr-runtime export PACKAGE --out DIR [--variant contrib|portable] [--dtype fp32|int8] [--opset N] [--shared-context]`."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from export.exporter import export_package

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
    )
    smoke = manifest["smoke_parity"]
    ops = sum(manifest["op_counts"].values())
    print(
        f"ok: {args.out} ({manifest['variant']}/{manifest['dtype']}, opset {manifest['opset']}, {ops} nodes, "
        f"domains {','.join(manifest['op_domains'])}); smoke parity max |dp| {smoke['max_abs_diff']:.2e}, "
        f"{smoke['decisions_changed']}/{smoke['questions']} decisions changed"
    )
    shared = manifest.get("shared_context")
    if shared:
        print(
            f"shared_context graph: {shared['model_file']} ({shared['weights_from_main']} weights read from the main graph's file); "
            f"smoke parity max |dp| {shared['smoke_parity']['max_abs_diff']:.2e}"
        )
    media = manifest.get("media")
    if media:
        worst = max(result["max_abs_diff"] for result in media["smoke_parity"].values())
        print(
            f"media graphs: {media['vision']['model_file']} (vision tower, per attention segment) and {media['text']['model_file']} "
            f"({media['text']['weights_from_main']} weights read from the main graph's file); smoke parity on images and video max |dp| {worst:.2e}"
        )
    return 0


def register(sub) -> None:
    from export.exporter import DEFAULT_OPSET, DTYPES, VARIANTS

    parser = sub.add_parser("export", help="export a verified package to an ONNX artifact (readout inside)")
    parser.add_argument("package", help="PATH or REPO@40-hex-REV")
    parser.add_argument("--out", required=True, help="artifact directory (written atomically)")
    parser.add_argument("--variant", default="contrib", choices=VARIANTS, help="contrib: com.microsoft fused GDN ops; portable: standard ops only")
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    parser.add_argument(
        "--shared-context", action="store_true",
        help="also export the shared_context graph (a request's common prefix once, its questions continue from it)",
    )  # fmt: skip
    parser.add_argument("--cache-dir")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--base-path")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
