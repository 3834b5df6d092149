"""Decision 2.0 package format (`dev2-package/1`, manifest `dev2-package-manifest/1`) and its verification."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.packages.files import MANIFEST_NAME, canonical_json, check_inventory, read_json, sha256_bytes, sha256_file
from vllm_sr_runtime.packages.safetensors_header import safetensors_element_count

MANIFEST_SCHEMA = "dev2-package-manifest/1"
POINTER_FIELDS = {"decision_format": "vllm-sr-decision", "format_version": 2, "package_schema": "dev2-package/1"}
RUNTIME_FAMILIES = {"decision2-qwen-full": "qwen-full", "decision2-qwen-adapter": "qwen-adapter"}
IDENTITY_ROOT_FILES = {
    "decision_config.json", "decision_head.safetensors", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
    "chat_template.jinja",
}  # fmt: skip
IDENTITY_DIRS = ("backbone/", "adapter/")
IDENTITY_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".txt")
HEAD_TENSORS = {
    "candidate_norm.weight", "candidate_norm.bias", "query_norm.weight", "query_norm.bias", "key.weight",
    "query.weight", "candidate_mlp.weight", "candidate_mlp.bias", "query_mlp.weight", "scalar.weight",
}  # fmt: skip
BACKBONE_TYPES = {"qwen3": "qwen3", "qwen3_5_text": "qwen3_5_text", "qwen3_5": "qwen3_5_text"}
FULL_REVISION = re.compile(r"^[0-9a-f]{40}$")


def is_identity_file(rel: str) -> bool:
    if "/" not in rel:
        return rel in IDENTITY_ROOT_FILES
    return rel.startswith(IDENTITY_DIRS) and rel.endswith(IDENTITY_SUFFIXES)


def model_sha256(files_sha256: dict[str, str], base_files_sha256: dict[str, str] | None = None) -> str:
    """Identity over the model-input files; adapters prefix `checkpoint/` and add the base under `source/`."""
    chosen = {rel: digest for rel, digest in files_sha256.items() if is_identity_file(rel)}
    if base_files_sha256 is not None:
        chosen = {f"checkpoint/{rel}": digest for rel, digest in chosen.items()}
        chosen.update({f"source/{rel}": digest for rel, digest in base_files_sha256.items()})
    return sha256_bytes(canonical_json(chosen))


def detect(root: Path) -> bool:
    """By the manifest's schema (so a damaged pointer is still reported as damaged), else by the pointer."""
    for rel, key, value in ((MANIFEST_NAME, "schema", MANIFEST_SCHEMA), ("config.json", "decision_format", "vllm-sr-decision")):
        try:
            if read_json(root, rel).get(key) == value:
                return True
        except PackageError:
            continue
    return False


@dataclass
class BaseCheckpoint:
    repo_id: str
    revision: str
    files_sha256: dict[str, str]
    path: Path | None = None


@dataclass
class Decision2Package:
    root: Path
    manifest: dict
    manifest_sha256: str
    pointer: dict
    decision_config: dict
    profile: str  # qwen-full | qwen-adapter
    backbone_type: str  # qwen3 | qwen3_5_text
    model_name: str
    model_sha256: str
    max_input_tokens: int
    loaded_parameters: int
    base: BaseCheckpoint | None = None
    score_offsets: dict[int, list[float]] = field(default_factory=dict)
    temperature_by_type: dict[str, float] = field(default_factory=lambda: {"choice": 1.0, "noul": 1.0, "score": 1.0})

    @property
    def family(self) -> str:
        return "decision2"


def verify(root: Path, *, base_path: Path | None = None, resolve_base=None) -> Decision2Package:
    """Checks everything before any tensor is loaded. `resolve_base(repo_id, revision) -> Path` finds an
    adapter's base when no `base_path` is given."""
    root = Path(root)
    manifest = read_json(root, MANIFEST_NAME)
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise PackageError(f"schema {manifest.get('schema')!r} is not {MANIFEST_SCHEMA}", MANIFEST_NAME)
    files_sha256 = manifest.get("files_sha256")
    if not isinstance(files_sha256, dict) or not files_sha256:
        raise PackageError("files_sha256 must be a non-empty object", MANIFEST_NAME)
    check_inventory(root, files_sha256)

    pointer = read_json(root, "config.json")
    for key, value in POINTER_FIELDS.items():
        if pointer.get(key) != value:
            raise PackageError(f"{key} must be {value!r}, found {pointer.get(key)!r}", "config.json")
    model_name = manifest.get("model_name")
    if "model_name" in pointer and pointer["model_name"] != model_name:
        raise PackageError("model_name differs from the manifest's", "config.json")
    profile = manifest.get("profile")
    if profile not in ("qwen-full", "qwen-adapter"):
        raise PackageError(f"profile {profile!r} is not a released Decision 2.0 profile", MANIFEST_NAME)
    family_tag = pointer.get("runtime_family")
    if family_tag is not None and RUNTIME_FAMILIES.get(family_tag) != profile:
        raise PackageError(f"runtime_family {family_tag!r} does not match profile {profile!r}", "config.json")

    decision_config = read_json(root, "decision_config.json")
    _check_decision_config(decision_config, profile)
    max_input_tokens = manifest.get("max_input_tokens")
    if not isinstance(max_input_tokens, int) or max_input_tokens < 16:
        raise PackageError("max_input_tokens must be an integer >= 16", MANIFEST_NAME)

    _check_head(root)
    _check_packaged_counts(root, manifest)

    base = None
    if profile == "qwen-adapter":
        base = _verify_base(manifest, base_path, resolve_base)
        backbone_config = read_json(base.path, "config.json")
        backbone_config = backbone_config.get("text_config", backbone_config)
    else:
        backbone_config = read_json(root, "backbone/config.json")
    backbone_type = BACKBONE_TYPES.get(backbone_config.get("model_type"))
    if backbone_type is None:
        raise PackageError(f"backbone model_type {backbone_config.get('model_type')!r} is not supported", "backbone/config.json")

    identity = (manifest.get("identity") or {}).get("model_sha256")
    actual = model_sha256(files_sha256, base.files_sha256 if base else None)
    if identity != actual:
        raise PackageError(f"identity model_sha256 {actual} differs from the manifest's {identity}", MANIFEST_NAME)

    package = Decision2Package(
        root=root,
        manifest=manifest,
        manifest_sha256=sha256_file(root / MANIFEST_NAME),
        pointer=pointer,
        decision_config=decision_config,
        profile=profile,
        backbone_type=backbone_type,
        model_name=str(model_name),
        model_sha256=actual,
        max_input_tokens=max_input_tokens,
        loaded_parameters=int((manifest.get("parameters") or {}).get("loaded", 0)),
        base=base,
    )
    _read_calibration(root, manifest, package)
    return package


def _check_decision_config(config: dict, profile: str) -> None:
    if config.get("head_variant", "shared") != "shared":
        raise PackageError(f"head_variant {config.get('head_variant')!r} is not supported (only 'shared')", "decision_config.json")
    if config.get("readout") == "label_token" or "dec_residual" in str(config.get("architecture", "")):
        raise PackageError("unreleased head type (label_token / dec_residual) is not supported", "decision_config.json")
    if not isinstance(config.get("head_dim"), int) or config["head_dim"] <= 0:
        raise PackageError("head_dim must be a positive integer", "decision_config.json")
    want = "peft-lora/1" if profile == "qwen-adapter" else "full"
    if config.get("checkpoint_format", want) != want:
        raise PackageError(f"checkpoint_format {config.get('checkpoint_format')!r} does not fit profile {profile}", "decision_config.json")


def _check_head(root: Path) -> None:
    from vllm_sr_runtime.packages.safetensors_header import safetensors_header

    header = safetensors_header(root / "decision_head.safetensors", "decision_head.safetensors")
    if set(header) != HEAD_TENSORS:
        raise PackageError(f"head tensors {sorted(header)} are not the 10 of the shared candidate head", "decision_head.safetensors")
    for name, entry in header.items():
        if entry["dtype"] != "F32":
            raise PackageError(f"{name} is {entry['dtype']}, the head is FP32", "decision_head.safetensors")


def _check_packaged_counts(root: Path, manifest: dict) -> None:
    parameters = manifest.get("parameters") or {}
    packaged = parameters.get("packaged") or {}
    packaged_files = parameters.get("packaged_files") or {}
    if not packaged or set(packaged) != set(packaged_files):
        raise PackageError("parameters.packaged and parameters.packaged_files must name the same groups", MANIFEST_NAME)
    for group, files in packaged_files.items():
        count = sum(safetensors_element_count(root / rel, rel) for rel in files if rel.endswith(".safetensors"))
        if count != packaged[group]:
            raise PackageError(
                f"group {group!r} holds {count} parameters, the manifest says {packaged[group]}", ", ".join(files)
            )


def _verify_base(manifest: dict, base_path: Path | None, resolve_base) -> BaseCheckpoint:
    info = manifest.get("base") or {}
    repo_id, revision, files = info.get("repo_id"), info.get("revision"), info.get("files_sha256")
    if not repo_id or not isinstance(revision, str) or not FULL_REVISION.match(revision) or not isinstance(files, dict):
        raise PackageError("an adapter manifest needs base {repo_id, 40-hex revision, files_sha256}", MANIFEST_NAME)
    if base_path is None:
        if resolve_base is None:
            raise PackageError(f"adapter needs its base {repo_id}@{revision}: pass base_path (--base-path)")
        try:
            base_path = resolve_base(repo_id, revision)
        except PackageError as exc:
            raise type(exc)(f"adapter's base checkpoint: {exc.message}; or pass a local copy of it as base_path (--base-path)") from None
    base_path = Path(base_path)
    for rel, digest in sorted(files.items()):
        path = base_path / rel
        if not path.is_file():
            raise PackageError("base checkpoint file listed in the manifest is missing", f"base:{rel}")
        actual = sha256_file(path)
        if actual != digest:
            raise PackageError(f"sha256 {actual} differs from the manifest's {digest}", f"base:{rel}")
    return BaseCheckpoint(repo_id=repo_id, revision=revision, files_sha256=files, path=base_path)


def _read_calibration(root: Path, manifest: dict, package: Decision2Package) -> None:
    bias = manifest.get("score_bias")
    if bias:
        data = read_json(root, bias["file"])
        if set(data) != {"format", "model_sha256", "offsets", "fit"} or data["format"] != "dev2-score-bias-v1":
            raise PackageError("score bias must have exactly format, model_sha256, offsets, fit (dev2-score-bias-v1)", bias["file"])
        if data["model_sha256"] != package.model_sha256:
            raise PackageError("score bias is bound to another model", bias["file"])
        if data["offsets"] != bias.get("offsets"):
            raise PackageError("score bias offsets differ from the manifest's", bias["file"])
        offsets = {}
        for key, values in data["offsets"].items():
            if not key.isdigit() or len(values) != int(key):
                raise PackageError(f"offsets[{key!r}] must list one float per level", bias["file"])
            offsets[int(key)] = [float(v) for v in values]
        package.score_offsets = offsets
    calibration = manifest.get("calibration")
    if calibration:
        data = read_json(root, calibration["file"])
        if data.get("format") != "decision2-per-type-temperature/1" or data.get("model_sha256") != package.model_sha256:
            raise PackageError("calibration must be decision2-per-type-temperature/1 bound to this model", calibration["file"])
        temps = data.get("temperature_by_type") or {}
        for kind in ("choice", "noul", "score"):
            value = float(temps.get(kind, 1.0))
            if not 0.05 <= value <= 20:
                raise PackageError(f"temperature for {kind} must lie in [0.05, 20]", calibration["file"])
            package.temperature_by_type[kind] = value
