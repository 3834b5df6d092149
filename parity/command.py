"""`vllm-sr-runtime parity MODEL [--against exact] [--profile max_speed] ...`: how far a profile answers from exact."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_sr_runtime.cli_options import add_licence_option, add_quiet_option, add_source_options
from vllm_sr_runtime.cli_values import close_call_margin, fraction
from vllm_sr_runtime.defaults import DEFAULT_MIN_SAVED_TOKENS
from vllm_sr_runtime.profiles import installed_profiles, profile_named, unused_artifact


def run(args: argparse.Namespace) -> int:
    import vllm_sr_runtime
    from vllm_sr_runtime.parity.compare import compare, default_gates, gates, summarize
    from vllm_sr_runtime.parity.report import write_report
    from vllm_sr_runtime.parity.suite import builtin_suite, short_suite
    from vllm_sr_runtime.report_folders import prepare_report_folder
    from vllm_sr_runtime.request_files import load_jsonl

    out = prepare_report_folder(Path(args.out), "parity")
    if args.weight_noise_factor != 1.0 and not args.weight_noise:
        raise ValueError("--weight-noise-factor scales --weight-noise: give --weight-noise int8 too")
    if args.artifact and (reason := unused_artifact(profile_named(args.profile))):
        raise ValueError(f"--artifact: {reason}")
    if args.weight_noise and (args.profile != "exact" or args.artifact):
        raise ValueError(f"--weight-noise perturbs the eager model's weights: use it with --profile exact, not {args.profile}")
    # A request file is read (and every line checked) before any model is loaded: that can take minutes.
    requests = load_jsonl(Path(args.suite)) if args.suite not in ("builtin", "short") else None
    common = {"device": args.device, "cache_dir": args.cache_dir, "offline": args.offline or None, "base_path": args.base_path, "accept_licences": args.accept_licence}
    if args.close_call_margin is not None and args.against != "exact":
        raise ValueError("--close-call-margin answers close calls again with exact: compare --against exact")
    reference = vllm_sr_runtime.load(args.model, profile=args.against, **common)
    if requests and not reference.family.reads_media and any(request.images or request.videos for request in requests):
        raise ValueError(f"--suite {args.suite} has images or videos and {reference.name} has no vision tower")  # before the second load
    candidate = vllm_sr_runtime.load(
        args.model, profile=args.profile, artifact=args.artifact, shared_min_tokens=args.shared_min_tokens, allow_approximate_shared_context=True, **common
    )  # measuring how far an approximate profile answers is what parity is for
    if args.close_call_margin is not None:
        candidate.confirm_close_calls(args.close_call_margin, lambda: (reference.engine, reference.dtype))  # one eager model serves both
        if candidate.close_calls is None:
            print("close calls: the artifact's int8 graph moved no calibration answer (no margin recorded): none answered again")
    noise = None
    if args.weight_noise:
        from vllm_sr_runtime.parity.weight_noise import perturb_like_int8

        noise = perturb_like_int8(candidate, args.weight_noise_factor)
    if args.suite == "builtin":
        # Models with a vision tower also get media requests, when the candidate's engine can read them.
        media = reference.family.reads_media and candidate.reads_media
        suite = builtin_suite(reference.family.max_input_tokens, media=media)
    elif args.suite == "short":
        suite = short_suite(reference.family.max_input_tokens)
    else:
        suite = requests
    rows = compare(reference, candidate, suite, progress=not args.quiet)
    summary = summarize(rows)
    # weight noise stands in for int8: held to int8's gate
    defaults = default_gates(noise["form"] if noise else candidate.dtype, candidate.approximate_by_design)
    chosen = {
        "max_changed_rate": args.max_changed_rate if args.max_changed_rate is not None else defaults["max_changed_rate"],
        "max_abs_diff": args.max_abs_diff if args.max_abs_diff is not None else defaults["max_abs_diff"],
    }
    failed = gates(summary, chosen["max_changed_rate"], chosen["max_abs_diff"])
    meta = {
        "model": reference.name,
        "model_sha256": reference.family.package.model_sha256,
        "against": args.against,
        "profile": args.profile,
        "reference_engine": reference.card()["engine"],
        "candidate_engine": candidate.engine.name,
        "candidate_dtype": candidate.dtype,
        "weight_noise": noise,  # --weight-noise: what was perturbed and by how much (None: the candidate as loaded)
        "shared_questions": candidate.shared_questions,  # shared_context: questions that really ran from a shared prefix
        # --close-call-margin: the margin and how many of the candidate's computed answers exact gave again (its cost)
        "close_calls": candidate.close_calls.describe() | {"reanswered": candidate.reanswered_questions, "answered": candidate.answered_questions}
        if candidate.close_calls else None,
        "suite": args.suite,
        "gates": chosen,
        "gates_from_flags": {"max_changed_rate": args.max_changed_rate is not None, "max_abs_diff": args.max_abs_diff is not None},
    }
    write_report(out, meta, summary, rows, failed)
    d = summary["abs_diff"]
    print(
        f"{summary['compared']} questions: {summary['decisions_changed']} decisions changed "
        f"({summary['near_ties_changed']} near-ties); |dp| median {d['median']:.3g}, p99 {d['p99']:.3g}, max {d['max']:.3g} "
        f"-> {out / 'report.html'}"
    )
    if args.profile == "shared_context":
        print(f"{candidate.shared_questions} of {summary['questions']} questions ran from a shared prefix")
    if candidate.close_calls:
        whose = ", the artifact's" if candidate.close_calls.margin_from == "artifact" else ""
        print(f"close calls (margin < {candidate.close_calls.margin:.3g}{whose}): {candidate.reanswered_questions} of {candidate.answered_questions} answers given again by exact")
    for failure in failed:
        print(f"gate failed: {failure}", file=sys.stderr)
    applied = ", ".join(f"{name.replace('_', ' ')} <= {value:g}" for name, value in chosen.items() if value is not None)
    if not failed:
        print(f"gates passed: {applied}" if applied else "no gate applied (set one with --max-changed-rate or --max-abs-diff)")
    return 3 if failed else 0


def register(sub) -> None:
    parser = sub.add_parser("parity", help="compare a profile's answers with exact's on a question suite")
    parser.add_argument("model", help="package directory or REPO@REV")
    parser.add_argument("--against", default="exact", choices=sorted(installed_profiles()), help="the reference profile (default exact)")
    parser.add_argument("--profile", default="max_speed", choices=sorted(installed_profiles()), help="the candidate profile measured against it")
    parser.add_argument("--artifact", help="artifact for the candidate profile (default: the cache's, exported on first use)")
    parser.add_argument("--suite", default="builtin", help="builtin (416+ questions), short (its first 80 short questions, choices of <= 12 options), or a JSONL file with one System One request per line")
    parser.add_argument("--out", default="parity-report", help="the report folder (parity.json, report.html and plots)")
    parser.add_argument(
        "--max-changed-rate", type=fraction,
        help="fail when more than this fraction of decisions change (default: 0.01 for fp16, bf16, int8 and approximate profiles; not gated for fp32)",
    )  # fmt: skip
    parser.add_argument("--max-abs-diff", type=fraction, help="fail when any probability moves by more than this (default: 1e-4 for fp32; not gated otherwise)")
    parser.add_argument(
        "--weight-noise", choices=("int8",),
        help="candidate = the eager model (--profile exact) with seeded Gaussian noise of int8's rounding size on every weight int8 quantizes: "
        "does this package tolerate any 8-bit weight form? (gated as int8)",
    )  # fmt: skip
    parser.add_argument("--weight-noise-factor", type=float, default=1.0, help="--weight-noise: noise RMS as a multiple of int8's rounding error")
    parser.add_argument("--shared-min-tokens", type=int, default=DEFAULT_MIN_SAVED_TOKENS, help="shared_context: break-even, (questions - 1) x prefix tokens")
    parser.add_argument(
        "--close-call-margin", type=close_call_margin, metavar="M|artifact",
        help="the candidate answers again with exact every question whose top-two margin is below M, as `serve --close-call-margin` "
        "does; parity.json records how many (close_calls); artifact: the margin the int8 artifact's export measured",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N], rocm[:N] or auto (both profiles run there)")
    add_source_options(parser)
    add_licence_option(parser)
    add_quiet_option(parser)
    parser.set_defaults(func=run)
