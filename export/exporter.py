"""package -> artifact: trace the family's module (readout inside) with torch.onnx (dynamo) into one graph."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import shutil
from pathlib import Path

import onnx
import torch
from tqdm import tqdm

from vllm_sr_runtime.artifacts import ARTIFACT_SCHEMA, atomic_directory, check_replaceable, write_manifest
from vllm_sr_runtime.export.context import ExportContext
from vllm_sr_runtime.export.disk_space import check_disk_space
from vllm_sr_runtime.export.graph_emit import emit_graph, gdn_dims, io_schema, translation_table
from vllm_sr_runtime.export.graph_passes import op_counts
from vllm_sr_runtime.export.int8 import INT8_FP32_PROJECTIONS, Int8Layout
from vllm_sr_runtime.export.int8_options import ACTIVATION_FORMS, DEFAULT_TARGET, EMBEDDING_CHOICES, INT8_FORMS, INT8_FP32_CHOICES, INT8_SENSITIVE_CHOICES, WEIGHT_BITS_CHOICES
from vllm_sr_runtime.export import int8_sensitivity
from vllm_sr_runtime.export.phases import PhaseClock, available_memory_bytes
from vllm_sr_runtime.export.smoke import CPU_SESSION_DTYPES, SMOKE_MODES, SMOKE_QUESTIONS, SMOKE_STATE, SMOKE_TOLERANCE, check_smoke, golden_answers, graph_parity, plan_smoke, smoke_parity
from vllm_sr_runtime.export.static_graphs import check_cuda_kernels, static_sequence_lengths, write_static_graphs
from vllm_sr_runtime.export.streaming import StreamedModule, trace
from vllm_sr_runtime.accelerators import CUDA
from vllm_sr_runtime.close_calls import margin_for
from vllm_sr_runtime.cpu_features import SAFE_WEIGHT_BITS, widest_int8_weight_bits
from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.export.export_options import DEFAULT_OPSET, MAX_OPSET, MEDIA_VARIANTS, MIN_OPSET, PORTABLE_DTYPES, SUPPORTED_DTYPES, VARIANTS
from vllm_sr_runtime.families import open_family
from vllm_sr_runtime.families.base import Family
from vllm_sr_runtime.numerics import Numerics
from vllm_sr_runtime.packages.resolve import resolve_package

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.float32}
MODEL_FILE, DATA_FILE = "model.onnx", "model.onnx.data"
SHARED_MODEL_FILE, SHARED_DATA_FILE = "model_shared.onnx", "model_shared.onnx.data"  # its own weights only
RUNTIME_FILES = (
    "MODEL_MANIFEST.json", "decision_config.json", "tokenizer.json", "tokenizer_config.json",
    "chat_template.jinja", "special_tokens_map.json", "score_bias.json", "calibration.json",
)  # fmt: skip
PHASES = ("load", "trace", "write", "check", "session", "smoke", "finalize")
SHARED_PHASES = ("shared trace", "shared write", "shared smoke")
def export_package(
    package: str | Path,
    out: str | Path,
    *,
    variant: str = "contrib",
    dtype: str = "fp32",
    opset: int = DEFAULT_OPSET,
    base_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    offline: bool | None = None,
    progress: bool = True,
    shared_context: bool = False,
    smoke: str = "auto",
    lengths: tuple[int, ...] | None = None,
    int8_activations: str = "token",
    int8_fp32: str = "measured",
    int8_target: float = DEFAULT_TARGET,
    int8_calibration: Path | None = None,
    int8_sensitive: str = INT8_SENSITIVE_CHOICES[0],
    int8_weight_bits: int = WEIGHT_BITS_CHOICES[0],
    int8_embedding: str = EMBEDDING_CHOICES[0],
) -> dict:
    check_options(
        variant=variant, dtype=dtype, opset=opset, shared_context=shared_context, smoke=smoke, lengths=lengths, int8_activations=int8_activations,
        int8_fp32=int8_fp32, int8_target=int8_target, int8_calibration=int8_calibration, int8_sensitive=int8_sensitive, int8_weight_bits=int8_weight_bits,
        int8_embedding=int8_embedding,
    )
    ref = resolve_package(package, cache_dir=cache_dir, offline=offline)
    family = open_family(ref, base_path=Path(base_path) if base_path else None, cache_dir=cache_dir, offline=offline)
    return export_family(
        family, Path(out), variant=variant, dtype=dtype, opset=opset, progress=progress, shared_context=shared_context, smoke=smoke, lengths=lengths,
        int8_activations=int8_activations, int8_fp32=int8_fp32, int8_target=int8_target, int8_calibration=int8_calibration, int8_sensitive=int8_sensitive,
        int8_weight_bits=int8_weight_bits, int8_embedding=int8_embedding,
    )


def check_options(
    *,
    variant: str,
    dtype: str,
    opset: int,
    shared_context: bool,
    smoke: str,
    lengths: tuple[int, ...] | None,
    int8_activations: str,
    int8_fp32: str,
    int8_target: float,
    int8_calibration: Path | None,
    int8_sensitive: str,
    int8_weight_bits: int,
    int8_embedding: str = EMBEDDING_CHOICES[0],
) -> None:
    """The export's options on their own and together, checked before the package is read."""
    choices = {
        "--variant": (variant, VARIANTS), "--dtype": (dtype, DTYPES), "--smoke": (smoke, SMOKE_MODES), "--int8-activations": (int8_activations, ACTIVATION_FORMS),
        "--int8-fp32": (int8_fp32, INT8_FP32_CHOICES), "--int8-sensitive": (int8_sensitive, INT8_SENSITIVE_CHOICES), "--int8-weight-bits": (int8_weight_bits, WEIGHT_BITS_CHOICES),
        "--int8-embedding": (int8_embedding, EMBEDDING_CHOICES),
    }  # fmt: skip
    for flag, (value, allowed) in choices.items():
        if value not in allowed:
            raise ValueError(f"{flag} must be one of {', '.join(map(str, allowed))}, not {value!r}")
    if dtype not in SUPPORTED_DTYPES:
        raise ArtifactError(f"--dtype {dtype} export is not supported (supported: {', '.join(SUPPORTED_DTYPES)})")
    if variant == "portable" and dtype not in PORTABLE_DTYPES:
        raise ArtifactError(f"--dtype {dtype} is for the contrib variant (the CUDA provider); the portable variant takes {', '.join(PORTABLE_DTYPES)}")
    if shared_context and variant == "portable":
        raise ArtifactError("--shared-context needs the contrib variant (the portable graphs have no past-state input)")
    if int8_sensitive == "split" and int8_activations != "token":
        raise ValueError(f"--int8-sensitive split reads activations per token (--int8-activations token), not per {int8_activations}")
    if int8_weight_bits != WEIGHT_BITS_CHOICES[0] and int8_activations == "block":
        raise ValueError("--int8-weight-bits 7 is for the integer-product forms (per token, per tensor, split): the block form's kernel (MatMulNBits) does not saturate and keeps 8 bits")
    if not int8_target > 0:
        raise ValueError(f"--int8-target must be > 0, not {int8_target}")
    if int8_calibration is not None and not (dtype == "int8" and int8_fp32 == "measured"):
        raise ValueError("--int8-calibration is what --dtype int8 --int8-fp32 measured measures on: give both, or drop it")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"--opset must be in {MIN_OPSET}..{MAX_OPSET}, not {opset}")
    if lengths and variant != "portable":
        raise ValueError("--lengths are the portable variant's static-length graphs: the contrib variant's graph takes any length")


def export_family(
    family: Family,
    out: Path,
    *,
    variant: str,
    dtype: str,
    opset: int = DEFAULT_OPSET,
    progress: bool = True,
    shared_context: bool = False,
    smoke: str = "auto",
    lengths: tuple[int, ...] | None = None,
    int8_activations: str = "token",
    int8_fp32: str = "measured",
    int8_target: float = DEFAULT_TARGET,
    int8_calibration: Path | None = None,
    int8_sensitive: str = INT8_SENSITIVE_CHOICES[0],
    int8_weight_bits: int = WEIGHT_BITS_CHOICES[0],
    int8_embedding: str = EMBEDDING_CHOICES[0],
) -> dict:
    """Trace, lower, write, check and smoke-test one artifact. `shared_context` adds a second graph,
    the module's forward_shared (prefix once, question rows continue from its state), for that profile
    on ONNX Runtime; it reads the main graph's weights file. `smoke` (auto|on|off): the smoke parity
    against eager, its own phase; auto runs it when the eager model and one ORT session fit in the
    memory that is free. The portable variant holds one graph per static sequence length (`lengths`,
    default: powers of two from 128 to the package's longest prompt); rows are padded to the next one.
    Under int8, `int8_fp32` says which MatMuls stay FP32 besides the fixed rule's: `measured` (the Linears this
    package's first-order sensitivity names, until every calibration row's predicted spread is `int8_target`
    times its margin or less) or `rule` (the fixed rule only). `int8_calibration`: a JSONL request file to measure on
    instead of the built-in calibration requests. `int8_sensitive`: where the measured choice moves a harmful Linear,
    `fp32`, or first `block` (MatMulNBits, when the rest run per token; FP32 only where that misses the target), or
    first `split` (two int8 halves of weight and activation, two integer products; FP32 only where that misses the
    target), which also runs the fixed rule's FP32 projections split. `int8_weight_bits`: 8, or 7 for x86 hosts
    without VNNI (whose int8 kernel saturates on 8-bit weights: the smoke parity is refused there at 8 bits).
    `int8_embedding`: `int8` stores the family's token embedding tables as int8 rows with a scale each."""
    if family.export_spec is None:
        raise ArtifactError(f"family {family.name} declares no export (its ExportSpec): it runs on its own engines only")
    package_root, target = family.package.root.resolve(), Path(out).resolve()
    if target == package_root or target in package_root.parents:
        raise ArtifactError(f"--out {out} holds the package being exported ({package_root}): the artifact replaces its folder as a whole")
    check_replaceable(Path(out))
    towers = family.export_spec.quantized_towers
    check_options(
        variant=variant, dtype=dtype, opset=opset, shared_context=shared_context, smoke=smoke, lengths=lengths, int8_activations=int8_activations,
        int8_fp32=int8_fp32, int8_target=int8_target, int8_calibration=int8_calibration, int8_sensitive=int8_sensitive, int8_weight_bits=int8_weight_bits,
        int8_embedding=int8_embedding,
    )
    # the int8 graph's products come out wrong on this CPU: nothing is checked with them here
    saturates_here = dtype == "int8" and int8_weight_bits > widest_int8_weight_bits()
    if saturates_here and smoke != "off":
        raise ArtifactError(
            "this CPU (x86-64 with AVX2 or AVX-512 but no VNNI) runs ONNX Runtime's int8 products with saturating 16-bit sums, "
            f"which 8-bit weights overflow, so the artifact could neither be smoke-tested nor served here: export with "
            f"--int8-weight-bits {SAFE_WEIGHT_BITS} to serve it on this host, or with --smoke off for a host with VNNI (check it there with `parity`)"
        )
    calibrate = dtype == "int8" and int8_fp32 == "measured"
    calibration = None
    if calibrate:
        calibration = int8_sensitivity.calibration_requests(int8_calibration) if int8_calibration is not None else int8_sensitivity.builtin_calibration(family)
        int8_sensitivity.check_calibration(family, calibration)
    if variant not in MEDIA_VARIANTS and family.reads_media:
        raise ArtifactError(
            f"the {variant} variant has no media graphs yet (MIGraphX compiles static shapes; the vision tower's patch "
            f"count varies per request): export the {' or '.join(MEDIA_VARIANTS)} variant for packages with a vision tower"
        )
    static_lengths = static_sequence_lengths(family.max_input_tokens, lengths) if variant == "portable" else None
    disk_needed = check_disk_space(out, family.card().get("parameters"), dtype)
    from vllm_sr_runtime.export.media_graphs import MEDIA_PHASES, export_media

    phase_count = len(PHASES) + 2 * calibrate + (len(SHARED_PHASES) if shared_context else 0) + (len(MEDIA_PHASES) if family.reads_media else 0)
    bar = tqdm(total=phase_count, desc=f"export {family.model_name} [{variant}/{dtype}]", disable=not progress, unit="step")
    phase = PhaseClock(bar, progress)

    try:
        phase("load")
        skeleton = build_export_module(family, dtype, weights=False, readout_rows_only=True)
        streamed = StreamedModule.of(skeleton, family.weight_sources(_numerics(family, dtype)))
        sample = family.plan(SMOKE_STATE, SMOKE_QUESTIONS).batches[0].inputs
        config = family.backbone_config()
        gdn = gdn_dims(config)
        bar.update()
        measured, calibration_answers = None, []
        tables = family.export_spec.embedding_tables if dtype == "int8" and int8_embedding == "int8" else ()
        if calibrate:
            phase("calibrate")
            measured, calibration_answers = measure_int8_sensitivity(
                family, int8_target, calibration, progress=progress, form=int8_activations, sensitive=int8_sensitive, weight_bits=int8_weight_bits, embedding_tables=tables
            )  # fmt: skip
            bar.update()
        split_rule = int8_sensitive == "split"
        chosen = {key: frozenset(measured[key]) if measured else frozenset() for key in ("kept", "blocked", "split")}
        layout = Int8Layout(towers=towers, activations=int8_activations, **chosen, split_rule=split_rule, weight_bits=int8_weight_bits, embedding_tables=tables)
        phase("trace")
        traced = trace(streamed, skeleton, sample, opset, family.input_names, family.dynamic_axes, family.output_name, translation_table(config))
        bar.update()
        with atomic_directory(out) as temp:
            phase("write")
            proto, main_weights = emit_graph(traced, temp, MODEL_FILE, DATA_FILE, dtype, progress=progress, int8=layout)
            reuse = main_weights["index"]
            buckets = write_static_graphs(proto, temp, family, gdn, static_lengths, MODEL_FILE) if static_lengths else None
            del traced, proto
            for rel in RUNTIME_FILES:
                if (family.package.root / rel).is_file():
                    shutil.copyfile(family.package.root / rel, temp / rel)
            bar.update()
            phase("check")
            onnx.checker.check_model(str(temp / MODEL_FILE), full_check=False)
            counts = op_counts(onnx.load(str(temp / MODEL_FILE), load_external_data=False))
            if variant == "portable" and any(key.startswith("com.microsoft::") for key in counts):
                raise ArtifactError("portable graph still holds com.microsoft nodes")
            cuda_check = check_cuda_kernels(temp / MODEL_FILE) if variant == "contrib" and dtype in CUDA.artifact_dtypes else None
            bar.update()
            phase("session")
            engine = None
            if dtype in CPU_SESSION_DTYPES:
                from vllm_sr_runtime.engines.onnxruntime import OrtEngine

                engine = OrtEngine.from_file(temp / MODEL_FILE, device_kind="cpu", output_name=family.output_name, buckets=buckets)
            bar.update()
            phase("smoke")
            smoke_plan = plan_smoke(smoke, family, temp / DATA_FILE, dtype)
            parity, eager, golden = None, None, None
            if smoke_plan["ran"]:
                eager = build_export_module(family, "fp32")  # the reference (exact's CPU numerics), beside one session
                parity = smoke_parity(family, eager, engine)
                check_smoke(parity, dtype)
                golden = golden_answers(family, eager)
            bar.update()
            context = ExportContext(family, streamed, temp, variant, dtype, opset, phase, bar.update, reuse=reuse, engine=engine, eager=eager, int8=layout)
            shared = _export_shared(context) if shared_context else None
            media = export_media(context) if family.reads_media else None
            del eager, context
            if calibrate:
                phase("calibration parity")
                if engine is not None and not saturates_here:  # the int8 graphs themselves on the answers the choice protected (recorded, not gated)
                    measured["calibration_parity"] = graph_parity(family, engine, calibration.requests, calibration_answers, calibration.prepared_media(family))
                    measured["calibration_parity"]["close_call_margin"] = margin_for(measured["calibration_parity"]["max_abs_diff"])
                bar.update()
            phase("finalize")
            last_layer = "readout_rows" if getattr(skeleton, "prunes_last_layer", False) else "full"
            manifest = _manifest(family, temp / MODEL_FILE, variant, dtype, opset, counts, parity, shared, media, last_layer)
            manifest["buckets"] = buckets
            manifest["golden"] = golden  # None when the smoke parity did not run (no eager model to answer)
            manifest["cuda_kernels"] = cuda_check
            if dtype == "int8":
                manifest["int8"] = {
                    "activations": INT8_FORMS[int8_activations][0], "weights": INT8_FORMS[int8_activations][1], "sensitive": int8_sensitive,
                    "weight_bits": int8_weight_bits, "kept_fp32": [] if split_rule else list(INT8_FP32_PROJECTIONS),
                    "split": list(INT8_FP32_PROJECTIONS) if split_rule else [], "fp32_choice": int8_fp32, "measured": measured,
                    "embedding": {"form": "int8 rows" if tables else "fp32", "tables": list(tables)},
                }  # fmt: skip
            manifest["smoke"] = {**smoke_plan, "rows": parity["questions"] if parity else 0, "tolerance": SMOKE_TOLERANCE.get(dtype)}
            manifest["export"] = {"phases": phase.finish(), "disk_estimate_bytes": disk_needed, "weights": "streamed from the package"}
            write_manifest(temp, manifest)
            bar.update()
    finally:
        bar.close()
    return json.loads((out / "artifact.json").read_text())


def _export_shared(context: ExportContext) -> dict:
    """The shared_context graph: traced from forward_shared, its weights read from the main graph's file,
    smoke-tested against the eager module's forward_shared (when the smoke parity runs)."""
    family, temp, dtype, phase = context.family, context.temp, context.dtype, context.phase
    phase("shared trace")
    plan = family.share(family.plan(SMOKE_STATE, SMOKE_QUESTIONS), 0)
    if not plan.batches[0].shared:
        raise ArtifactError("the smoke questions share no prefix; cannot trace the shared_context graph")
    inputs = plan.batches[0].inputs
    module = context.streamed.module
    traced = trace(
        context.streamed, module, inputs, context.opset, family.shared_input_names, family.shared_dynamic_axes, family.output_name, translation_table(family.backbone_config()), "forward_shared"
    )  # fmt: skip
    context.step()
    phase("shared write")
    model, weights = emit_graph(traced, temp, SHARED_MODEL_FILE, SHARED_DATA_FILE, dtype, reuse=context.reuse, int8=context.int8)
    onnx.checker.check_model(str(temp / SHARED_MODEL_FILE), full_check=False)
    io = {"inputs": io_schema(model.graph.input), "outputs": io_schema(model.graph.output)}
    del model, traced
    context.step()
    phase("shared smoke")
    if context.engine is not None:
        context.engine.attach_shared(temp / SHARED_MODEL_FILE)
    smoke = smoke_parity(family, context.eager, context.engine, profile="shared_context") if context.eager is not None else None
    if smoke is not None:
        check_smoke(smoke, dtype, "shared_context smoke parity")
    context.step()
    return {
        "model_file": SHARED_MODEL_FILE,
        "io": io,
        "dynamic_axes": {name: {str(k): v for k, v in axes.items()} for name, axes in family.shared_dynamic_axes.items()},
        "weights_from_main": weights["shared"],
        "smoke_parity": smoke,
    }


def _numerics(family: Family, dtype: str = "fp32") -> Numerics:
    """The CPU policy (FP32), with the backbone's parameters (and so its compute) in `dtype` for fp16/bf16;
    what the policy keeps FP32 (gates and decay, norm statistics, the readout and its softmax) stays FP32."""
    numerics = family.numerics("cpu")
    return dataclasses.replace(numerics, parameter_dtype=DTYPES[dtype]) if dtype in ("fp16", "bf16") else numerics


def measure_int8_sensitivity(
    family: Family,
    target: float,
    calibration: int8_sensitivity.Calibration | None = None,
    progress: bool = False,
    form: str = "token",
    sensitive: str = INT8_SENSITIVE_CHOICES[0],
    weight_bits: int = WEIGHT_BITS_CHOICES[0],
    embedding_tables: tuple[str, ...] = (),
) -> tuple[dict, list[list[float] | None]]:
    """The Linears this package keeps FP32 under int8, measured on the eager FP32 module (loaded for this only) on
    `calibration` (default: the built-in requests), as the manifest records them, and the eager answers to the
    calibration questions; with the `embedding_tables` stored as int8 rows, their rounding counted too. Refused,
    before loading anything, where the eager model and its backward would not fit in free memory, and after
    measuring where the int8 tables alone move a calibration answer's margin beyond `target` (no choice helps)."""
    parameters = int(family.card().get("parameters") or 0)
    needed, available = int8_sensitivity.CALIBRATION_BYTES_PER_PARAMETER * parameters, available_memory_bytes()
    if available is not None and needed > available:
        raise ArtifactError(
            f"--int8-fp32 measured backpropagates calibration requests through the eager FP32 model: about {needed / 2**30:.1f} GiB, "
            f"{available / 2**30:.1f} GiB free. Free memory, or export with --int8-fp32 rule (the fixed FP32 rule only) and judge "
            "the artifact with `vllm-sr-runtime parity`"
        )
    eager = build_export_module(family, "fp32")
    calibration = calibration or int8_sensitivity.builtin_calibration(family)
    # the per-tensor form is measured as per token: its single scale is data-wide, which a first-order model of
    # one calibration row at a time cannot see
    rounding = form if form in int8_sensitivity.ROUNDING_FORMS else "token"
    # `sensitive`: where the most harmful Linears go first, the block form (if the rest run per token) or FP32
    tier = sensitive if sensitive in int8_sensitivity.TIER_FORMS and form == "token" else None
    sensitivity = int8_sensitivity.measure(
        family, eager, list(calibration.requests), progress=progress, form=rounding, tier=tier, weight_bits=weight_bits, embedding_tables=embedding_tables,
        media_requests=calibration.media,
    )  # fmt: skip
    del eager
    alone = sensitivity.fixed_spread()
    if alone is not None and alone > target:
        raise ArtifactError(
            f"--int8-embedding int8: rounding the token embedding table's rows alone moves a calibration answer by {alone:.3g} of "
            f"its margin (first order; the target is {target}), and keeping MatMuls FP32 cannot undo that: this package "
            "needs its table FP32. Export without --int8-embedding int8 (or raise --int8-target and judge it with `parity`)"
        )
    if tier:
        kept, tiered = int8_sensitivity.choose_tiers(sensitivity, target)
    else:
        kept, tiered = int8_sensitivity.choose(sensitivity, target), []
    # calibration_parity: the finished int8 graph against these eager answers, filled in by the smoke phase
    return {**int8_sensitivity.summary(sensitivity, kept, target, tiered), "calibration": calibration.source, "calibration_parity": None}, sensitivity.answers


def build_export_module(family: Family, dtype: str, *, weights: bool = True, readout_rows_only: bool = False) -> torch.nn.Module:
    """The module the graphs are traced from (`readout_rows_only`), or their eager reference: without `weights` its
    parameters are meta tensors (the trace needs shapes only; `Family.weight_sources` says where each weight is
    read from when it is written)."""
    return family.export_module(_numerics(family, dtype), weights=weights, readout_rows_only=readout_rows_only)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _manifest(
    family: Family, model_path: Path, variant: str, dtype: str, opset: int, counts: dict, smoke: dict, shared: dict | None, media: dict | None,
    last_layer: str,
) -> dict:
    package = family.package
    model = onnx.load(str(model_path), load_external_data=False)
    return {
        "schema": ARTIFACT_SCHEMA,
        "source": {
            "family": family.name,
            "model_name": package.model_name,
            "repo_id": family.ref.repo_id,
            "revision": family.ref.revision,
            "model_sha256": package.model_sha256,
            "manifest_sha256": package.manifest_sha256,
        },
        "variant": variant,
        "dtype": dtype,
        "opset": opset,
        "last_layer": last_layer,  # readout_rows: the graphs' last layer computes the rows the readout reads, no others
        "op_domains": sorted({key.split("::")[0] for key in counts}),
        "op_counts": counts,
        "io": {"inputs": io_schema(model.graph.input), "outputs": io_schema(model.graph.output)},
        "dynamic_axes": {name: {str(k): v for k, v in axes.items()} for name, axes in family.dynamic_axes.items()},
        "model_file": MODEL_FILE,
        "tools": {name: _version(name) for name in ("vllm-sr-runtime", "torch", "transformers", "onnx", "onnxscript", "onnxruntime")},
        "smoke_parity": smoke,
        "shared_context": shared,  # the forward_shared graph, when exported with --shared-context
        "media": media,  # the vision and media text graphs, for packages with a vision tower
    }
