"""`vllm-sr-runtime bench MODEL --mode forward|http|export ...`: latency, throughput and fraction of the GEMM
limit; or an export's wall time and peak RSS per phase."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from vllm_sr_runtime.cli_options import add_licence_option, add_quiet_option, add_source_options
from vllm_sr_runtime.cli_values import choice_list, counts, positive_float, positive_int
from vllm_sr_runtime.profiles import installed_profiles
from vllm_sr_runtime.report_folders import figure_png, prepare_report_folder, write_report_file

NOISY_HOST_SPREAD = 1.25  # fastest ceiling sample over slowest beyond which the run warns that the host was not quiet


def machine() -> dict:
    model_name = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import onnxruntime
    import torch

    from vllm_sr_runtime.cpu_threads import cpu_affinity

    return {"cpu": model_name, "cpus_in_affinity": cpu_affinity(), "platform": platform.platform(), "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "torch_threads": torch.get_num_threads()}


def print_table(rows: list[dict]) -> None:
    columns = ["profile", "length", "questions", "concurrency", "median_ms", "p90_ms", "rps", "ratio_to_exact", "gflops", "ceiling", "fraction_of_limit"]
    if any("errors" in row for row in rows):  # http: failed requests (not 200, not 429)
        columns.append("errors")
    print("  ".join(f"{c:>14}" for c in columns))
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column)
            cells.append(f"{value:>14.3f}" if isinstance(value, float) else f"{str(value):>14}")
        print("  ".join(cells))


def plot(rows: list[dict], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    forward = [r for r in rows if r["profile"] != "server"]
    if forward:
        figure, axis = plt.subplots(figsize=(6, 4))
        for profile in sorted({r["profile"] for r in forward}):
            for count in sorted({r["questions"] for r in forward}):
                series = sorted((r["length"], r["median_ms"]) for r in forward if r["profile"] == profile and r["questions"] == count)
                axis.plot([s[0] for s in series], [s[1] for s in series], marker="o", label=f"{profile}, {count} q")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("prompt tokens")
        axis.set_ylabel("median request latency (ms)")
        axis.legend(fontsize=8)
        write_report_file(out / "latency_vs_length.png", figure_png(figure))
        written.append("latency_vs_length.png")
    server = [r for r in rows if r["profile"] == "server"]
    if server:
        figure, axis = plt.subplots(figsize=(6, 4))
        axis.plot([r["concurrency"] for r in server], [r["rps"] for r in server], marker="o")
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel("requests/s")
        write_report_file(out / "rps_vs_clients.png", figure_png(figure))
        written.append("rps_vs_clients.png")
    return written


def profile_graphs(models: dict, length: int, limits: dict[str, float]) -> dict:
    """Per-op-type time of every ONNX Runtime model at one prompt length (one question); each matrix-product op's
    throughput against the ceiling for its arithmetic, and `bound`: the fraction of the row's ceiling the graph
    would reach if only its product ops took time (the forward's work as the rows count it, over their time)."""
    from vllm_sr_runtime.bench.flops import batches_flops, ceiling_for, computes_readout_rows_only
    from vllm_sr_runtime.bench.forward import request_of_length
    from vllm_sr_runtime.bench.ort_profile import judge_products, print_profile, profile_by_op, profiled_graphs

    profiles = {}
    for label, path in profiled_graphs(models).items():
        model = models[label]
        state, questions, tokens = request_of_length(model, length, 1)
        batch = model.plan(state, questions).batches[0]
        rows = profile_by_op(path, batch.inputs)
        ceiling = ceiling_for(getattr(model, "dtype", "fp32") or "fp32")
        summary = judge_products(rows, limits, batches_flops(model.family, [batch], computes_readout_rows_only(model)), ceiling)
        profiles[label] = {"length": tokens, "ops": rows, **summary}
        print_profile(f"{label}, {tokens} tokens", rows)
        if summary["bound"] is not None:
            print(f"  matrix products (attention included): {100 * summary['product_share']:.1f}% of the time; with every other op free this graph would reach {summary['bound']:.2f} of the {ceiling} ceiling")
    return profiles


def print_limits(result: dict) -> None:
    from vllm_sr_runtime.bench.flops import GEMM_SHAPE

    samples, spread = result["gemm_limit_samples"], result["gemm_limit_spread"]
    threads = result["machine"]["cpus_in_affinity"]
    shape = "x".join(str(size) for size in GEMM_SHAPE)
    print(
        f"GEMM limit (ORT fp32 MatMul {shape}, {threads} threads): {result['gemm_limit_gflops']:.1f} GFLOP/s, the fastest of "
        f"{len(samples['fp32'])} samples between the rows (slowest {min(samples['fp32']):.0f})"
    )
    print(
        f"int8 GEMM limit (ORT dynamic int8 MatMul, same shape and threads): {result['gemm_limits']['int8']:.1f} GOP/s "
        f"(slowest {min(samples['int8']):.0f}); rows of int8 artifacts are fractions of it"
    )
    moved = max(spread.values())
    if moved > NOISY_HOST_SPREAD:
        print(
            f"warning: this host's GEMM speed moved {moved:.2f}x between samples (other load, or power states): rows may "
            "have run below the machine's speed too; compare rows of this run only, and prefer more --repeats"
        )


def row_labels(entries: list[tuple[str, str, str | None]], artifact_count: int) -> list[str]:
    """Each loaded (profile, dtype, artifact) its row label: the profile; `max_speed-<dtype>` when several
    artifacts are benched; `...@<folder>` when two artifacts share a dtype (two int8 forms side by side)."""
    labels = []
    for profile, dtype, artifact in entries:
        if profile == "shared_context" and artifact is not None:
            labels.append(f"shared_context-onnx-{dtype}")  # the artifact's shared_context graph
        else:
            labels.append(profile if profile != "max_speed" or artifact_count == 1 else f"max_speed-{dtype}")
    repeated = {label for label in labels if labels.count(label) > 1}
    labels = [f"{label}@{Path(artifact).name}" if label in repeated and artifact is not None else label for label, (_, _, artifact) in zip(labels, entries)]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two artifacts of one dtype in folders of one name ({', '.join(sorted(set(l for l in labels if labels.count(l) > 1)))}): give distinct folders")
    return labels


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    out = prepare_report_folder(Path(args.out), "bench")
    result: dict = {"mode": args.mode, "machine": machine()}
    if args.mode == "forward":
        import vllm_sr_runtime
        from vllm_sr_runtime.bench.flops import GemmCeilings
        from vllm_sr_runtime.bench.forward import run_forward

        profiles = args.profiles
        check_forward_inputs(args.model, profiles, args.artifact or [])
        artifacts = args.artifact or [None]
        loaded = []
        for profile in profiles:
            for artifact in _artifacts_for(profile, artifacts):
                model = vllm_sr_runtime.load(
                    args.model, device=args.device, profile=profile, artifact=artifact, cache_dir=args.cache_dir, base_path=args.base_path,
                    offline=args.offline or None, accept_licences=args.accept_licence, allow_approximate_shared_context=True,  # timed, not served
                )
                if args.media != "none" and not model.family.reads_media:  # before the other profiles load, not after
                    raise ValueError(f"--media {args.media}: {model.name} has no vision tower (Decision 3.0 packages with one read images and videos)")
                loaded.append((profile, model.dtype, artifact, model))
        labels = row_labels([entry[:3] for entry in loaded], len(artifacts))
        models = {label: entry[3] for label, entry in zip(labels, loaded)}
        if args.ort_profile:
            from vllm_sr_runtime.bench.ort_profile import refuse_off_cpu

            refuse_off_cpu(models)  # before the timing, not after it
        # The ceilings are ORT CPU GEMMs: a row that ran on a GPU is not a fraction of them.
        on_cpu = all(model.device.kind == "cpu" for model in models.values())
        ceilings = GemmCeilings() if on_cpu else None
        result["model"] = {"name": next(iter(models.values())).name, "family": next(iter(models.values())).family.name}
        lengths, questions = args.lengths, args.questions
        bar = tqdm(total=len(lengths) * len(questions) * args.repeats, desc="bench forward", disable=args.quiet)
        result["rows"] = run_forward(models, lengths, questions, args.repeats, ceilings, bar.update, media=args.media)
        bar.close()
        if ceilings:
            limits = ceilings.best()
            result["gemm_limit_gflops"] = limits["fp32"]
            result["gemm_limits"] = limits  # fp32 GFLOP/s and dynamic int8 GOP/s, same shape and threads: the fastest samples
            result["gemm_limit_samples"] = ceilings.samples  # one per round of repeats, taken between the rows
            result["gemm_limit_spread"] = ceilings.spread()  # fastest sample over slowest
        else:
            result["gemm_limits"] = None
            print("no ceilings: they are measured for CPU rows only (the models run on " + ", ".join(sorted({m.device.name for m in models.values()})) + ")")
        if args.ort_profile:
            result["ort_profile"] = profile_graphs(models, max(lengths), result["gemm_limits"] or {})
    elif args.mode == "export":
        from vllm_sr_runtime.bench.export_run import print_export_table, run_export

        if not args.model:
            raise ValueError("--mode export needs a package")
        result["model"] = args.model
        result["rows"] = []
        extra = (
            (["--base-path", args.base_path] if args.base_path else []) + (["--cache-dir", args.cache_dir] if args.cache_dir else [])
            + (["--offline"] if args.offline else [])
        )  # fmt: skip
        for dtype in [d for d in args.dtype.split(",") if d]:
            result["rows"] += run_export(args.model, dtype, smoke=args.smoke, variant=args.variant, extra=extra)["rows"]
        write_report_file(out / "bench.json", json.dumps(result, indent=2) + "\n")
        print_export_table(result["rows"])
        print(out / "bench.json")
        return 0
    else:
        from vllm_sr_runtime.bench.http_load import run_http

        if not (args.url or args.uds):
            raise ValueError("--mode http needs --url or --uds of a running server")
        concurrency = args.concurrency
        bar = tqdm(total=len(concurrency), desc="bench http", disable=args.quiet)
        result["target"] = args.url or f"unix:{args.uds}"
        served = [name for name in (args.model or "").split(",") if name] or None
        result["rows"] = run_http(args.url, args.uds, concurrency, args.duration, bar.update, on_wait=lambda text: print(text, file=sys.stderr), models=served)
        bar.close()
    write_report_file(out / "bench.json", json.dumps(result, indent=2) + "\n")
    print_table(result["rows"])
    if result.get("gemm_limit_gflops"):
        print_limits(result)
    if args.plot:
        for name in plot(result["rows"], out):
            print(out / name)
    print(out / "bench.json")
    return 0


def check_forward_inputs(model: str | None, profiles: list[str], artifacts: list[str]) -> None:
    """Before any model loads: a package to load, and artifacts that are there and that some profile runs."""
    from vllm_sr_runtime.artifacts import check_artifact_folder

    if not model:
        raise ValueError("--mode forward needs a package")
    for artifact in artifacts:
        check_artifact_folder(Path(artifact))
    if artifacts and not any(artifact for profile in profiles for artifact in _artifacts_for(profile, artifacts)):
        raise ValueError(
            f"--artifact: no profile in --profiles {','.join(profiles)} runs it "
            "(max_speed runs each artifact, shared_context each one exported with --shared-context)"
        )


def _artifacts_for(profile: str, artifacts: list) -> list:
    """max_speed runs every given artifact; shared_context runs eagerly and on each artifact that has its graph."""
    if profile == "max_speed":
        return artifacts
    if profile == "shared_context":
        from vllm_sr_runtime.artifacts import ARTIFACT_FILE

        with_graph = [a for a in artifacts if a and (json.loads((Path(a) / ARTIFACT_FILE).read_text()).get("shared_context"))]
        return [None, *with_graph]
    return [None]


def register(sub) -> None:
    parser = sub.add_parser("bench", help="measure latency/throughput per profile (forward) or against a server (http)")
    parser.add_argument("model", nargs="?", help="forward, export: the package; http: the served model name(s) the requests name, a comma list taken in turn (default: every model the server has ready)")
    parser.add_argument("--mode", default="forward", choices=["forward", "http", "export"], help="export: wall time and peak RSS of each export phase, each dtype in a child process")
    parser.add_argument("--profiles", type=choice_list(installed_profiles(), "profile"), default="exact,max_speed", help="forward: a comma list of profiles")
    parser.add_argument("--lengths", type=counts, default="64,128,512,2048", help="prompt lengths in tokens (a length below the prompt template's own runs at the template's)")
    parser.add_argument("--questions", type=counts, default="1,8", help="forward: questions per request, a comma list")
    parser.add_argument("--concurrency", type=counts, default="1,8,64", help="http: concurrent clients, a comma list of levels")
    parser.add_argument("--duration", type=positive_float, default=10.0, help="seconds per concurrency level (http)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per profile and shape after a warm-up (forward)")
    parser.add_argument("--url", help="server URL, e.g. http://127.0.0.1:8100 (http)")
    parser.add_argument("--uds", help="server Unix socket (http)")
    parser.add_argument("--artifact", action="append", help="max_speed artifact; repeat to compare several (rows max_speed-<dtype>); one exported with --shared-context also adds a shared_context-onnx-<dtype> row")
    parser.add_argument("--device", default="cpu", help="forward: cpu, cuda[:N], rocm[:N] or auto")
    add_source_options(parser)
    add_licence_option(parser)
    parser.add_argument("--out", default="bench-results", help="the report folder (bench.json and charts)")
    parser.add_argument("--plot", action="store_true", help="also write PNG charts")
    parser.add_argument("--media", default="none", choices=["none", "image", "video", "image+video"], help="forward: every request also carries a synthetic image (640x480) and/or video (4 s, 320x256); Decision 3.0 packages with a vision tower")
    parser.add_argument("--ort-profile", action="store_true", help="also profile each ONNX Runtime graph per op type (forward)")
    parser.add_argument("--dtype", default="fp32", help="export: comma-separated dtypes, e.g. fp32,int8")
    parser.add_argument("--variant", default="contrib", choices=["contrib", "portable"], help="export: graph variant")
    parser.add_argument("--smoke", default="off", choices=["auto", "on", "off"], help="export: smoke parity (off by default: measure the export itself)")
    add_quiet_option(parser)
    parser.set_defaults(func=run)
