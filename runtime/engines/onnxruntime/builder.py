"""The onnxruntime engine plugin: a family's rows through an exported artifact (max_speed, and batching or
shared_context given an artifact). With no artifact, the package's is exported on first use into the cache,
through the registered exporter (the runtime does not import `export`)."""

from __future__ import annotations

from pathlib import Path

from vllm_sr_runtime.artifacts import read_artifact, registered_exporter
from vllm_sr_runtime.devices import Device
from vllm_sr_runtime.engines import ModelSource
from vllm_sr_runtime.engines.onnxruntime import OrtEngine
from vllm_sr_runtime.cpu_features import FULL_WEIGHT_BITS, SAFE_WEIGHT_BITS, widest_int8_weight_bits
from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.packages.resolve import default_cache_dir


def default_variant(device: Device) -> str:
    return device.spec.variant or "contrib"


def cached_artifact_dir(family: ModelSource, variant: str, dtype: str, cache_dir=None) -> Path:
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return root / "artifacts" / f"{family.model_name}@{family.package.model_sha256[:8]}" / f"{variant}-{dtype}"


def cached_artifact_current(family: ModelSource, target: Path) -> bool:
    """Whether the cache's artifact is there and serves as it is (one exported before artifacts held the vision
    graphs is exported again on first use)."""
    return (target / "artifact.json").is_file() and not _lacks_media_graphs(family, target)


def ensure_cached_artifact(family: ModelSource, variant: str, cache_dir=None) -> Path:
    """The cache's artifact for this package, exported on first use. A file lock makes concurrent first uses
    (several gunicorn workers, several processes) export once; the others wait and reuse it. One already there is
    used as it is (a read-only cache baked into an image serves without taking the lock)."""
    import fcntl

    target = cached_artifact_dir(family, variant, "fp32", cache_dir)
    if cached_artifact_current(family, target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.parent / f".{target.name}.lock", "w")
    except OSError as exc:
        raise ArtifactError(
            f"no artifact given and the cache cannot hold one exported now ({exc}): export one with "
            f"`vllm-sr-runtime export` and pass --artifact, or give a writable --cache-dir"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "artifact.json").is_file() and _lacks_media_graphs(family, target):
            import shutil

            shutil.rmtree(target)  # exported before artifacts held the vision graphs: export again
        if not (target / "artifact.json").is_file():
            registered_exporter()(family, target, variant=variant, dtype="fp32", progress=False)
    return target


INTEGER_PRODUCTS = ("ai.onnx::MatMulInteger", "com.microsoft::MatMulIntegerToFloat", "com.microsoft::DynamicQuantizeMatMul")


def refuse_saturating_int8(manifest: dict, artifact: Path, saturates: bool | None = None) -> None:
    """Refuse an int8 artifact whose integer products read 8-bit weights on a CPU where ORT's u8 x s8 kernel saturates
    (`cpu_features`; `saturates` overrides the detection): its answers there are not the ones its parity measured.
    Artifacts from before `int8.weight_bits` was recorded hold 8-bit weights."""
    if manifest.get("dtype") != "int8" or not any(op in manifest.get("op_counts", {}) for op in INTEGER_PRODUCTS):
        return
    bits = (manifest.get("int8") or {}).get("weight_bits", FULL_WEIGHT_BITS)
    if bits <= widest_int8_weight_bits(saturates):
        return
    raise ArtifactError(
        f"artifact {artifact} is int8 with {bits}-bit weights, and this CPU (x86-64 with AVX2 or AVX-512 but no VNNI) runs "
        "ONNX Runtime's int8 products with saturating 16-bit sums, which 8-bit weights overflow: its answers here would "
        f"not be the ones its parity measured. Export it for this host with --dtype int8 --int8-weight-bits {SAFE_WEIGHT_BITS}, or "
        "serve an fp32 artifact"
    )


def _lacks_media_graphs(family: ModelSource, artifact: Path) -> bool:
    import json

    return family.reads_media and not json.loads((artifact / "artifact.json").read_text()).get("media")


def build(family: ModelSource, device: Device, profile, *, artifact=None, cache_dir=None, **_: object) -> tuple[OrtEngine, str]:
    """The artifact's engine; for a profile that shares a prefix also its forward_shared graph."""
    if family.export_spec is None:
        raise ArtifactError(f"model {family.model_name} ({family.name}) has no exported graphs: profile {profile.name} cannot run it on onnxruntime")
    variant = default_variant(device)
    if artifact is None:
        artifact = ensure_cached_artifact(family, variant, cache_dir)
    artifact = Path(artifact)
    manifest = read_artifact(artifact)
    source = manifest["source"]
    if source["model_sha256"] != family.package.model_sha256:
        raise ArtifactError(
            f"artifact {artifact} was exported from model {source['model_sha256'][:12]}…, not this package "
            f"({family.package.model_sha256[:12]}…)"
        )
    needed = device.spec.variant
    if needed and manifest["variant"] != needed:
        raise ArtifactError(f"device {device.name} needs the {needed} variant, artifact {artifact} is {manifest['variant']}")
    runs = device.spec.artifact_dtypes
    if manifest["dtype"] not in runs:
        raise ArtifactError(
            f"artifact {artifact} is {manifest['dtype']}; {' or '.join(p.name for p in device.spec.providers)} on {device.name} runs {', '.join(runs)} artifacts "
            f"(export one with --dtype {runs[0]})"
        )
    if device.kind == "cpu":
        refuse_saturating_int8(manifest, artifact)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    engine = OrtEngine.from_file(
        artifact / manifest["model_file"], device_kind=device.kind, device_index=device.index, output_name=family.output_name,
        optimized_cache=root / "ort-optimized", buckets=manifest.get("buckets"),
    )  # fmt: skip
    if profile.shares_prefix:
        shared = manifest.get("shared_context")
        if not shared:
            raise ArtifactError(f"artifact {artifact} has no shared_context graph; export it with --shared-context")
        engine.attach_shared(artifact / shared["model_file"])
    media = manifest.get("media")
    if media:
        from vllm_sr_runtime.engines.onnxruntime.vision_segments import VisionLayout

        engine.attach_media(
            artifact / media["vision"]["model_file"], artifact / media["text"]["model_file"], VisionLayout(**media["vision"]["layout"]), family.media_modalities
        )  # fmt: skip
    engine.artifact = manifest
    engine.golden = manifest.get("golden")
    engine.model_path = artifact / manifest["model_file"]
    return engine, manifest["dtype"]


def expected_weight_bytes(family: ModelSource, device: Device, profile, *, artifact=None, cache_dir=None, **_: object) -> int | None:
    """Before the sessions open: the graphs `build` opens for the profile and their weight files, as the artifact
    lists them (the cache's where none is given, once exported and current), or, to be exported, the package's
    parameters in FP32. None where neither is known."""
    if artifact is None:
        cached = cached_artifact_dir(family, default_variant(device), "fp32", cache_dir)
        if not cached_artifact_current(family, cached):  # to be exported (again)
            count = family.parameter_count
            return None if count is None else 4 * count
        artifact = cached
    try:
        manifest = read_artifact(Path(artifact))
    except ArtifactError:
        return None  # the build names what is wrong with it
    graphs = [manifest["model_file"]]
    if buckets := manifest.get("buckets"):  # every length's graph holds its own weights (on the CPU, opened on first use)
        graphs = sorted({graph["model_file"] for graph in buckets["graphs"]} | set(graphs))
    if profile.shares_prefix and manifest.get("shared_context"):
        graphs.append(manifest["shared_context"]["model_file"])
    if media := manifest.get("media"):
        graphs += [media["vision"]["model_file"], media["text"]["model_file"]]
    files = manifest.get("files") or {}
    return sum(int(files.get(name, {}).get("bytes", 0)) for graph in graphs for name in (graph, graph + ".data"))


build.expected_weight_bytes = expected_weight_bytes  # type: ignore[attr-defined]
