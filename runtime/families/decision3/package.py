"""Decision 3.0 package format (`d3-code-readout-v1`, manifest `d3-package-manifest/1`) and its verification."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.packages.files import MANIFEST_NAME, canonical_json, check_inventory, read_json, sha256_bytes, sha256_file
from vllm_sr_runtime.packages.safetensors_header import safetensors_header

MANIFEST_SCHEMA = "d3-package-manifest/1"
FORMAT_ID = "d3-code-readout-v1"
DECISION_IDENTITY_FIELDS = (
    "format_version", "format_id", "prompt", "base_model", "revision", "codes", "token_ids", "temperature",
    "attention_mode", "pooling", "max_length", "readout_dtype",
)  # fmt: skip
IDENTITY_EXTRA_FILES = ("readout.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
ATTENTION_MODES = ("causal", "noncausal_full_attention")
NUM_CODES = 255
TEXT_PREFIXES = ("language_model.", "model.language_model.")
VISION_PREFIXES = ("visual.", "model.visual.")
WEIGHT_FILE = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors$")


def weight_files(names) -> list[str]:
    return sorted(rel for rel in names if WEIGHT_FILE.match(rel))


def identity_payload(files_sha256: dict[str, str], decision_config: dict) -> dict:
    files = {rel: files_sha256[rel] for rel in weight_files(files_sha256)}
    files.update({rel: files_sha256[rel] for rel in IDENTITY_EXTRA_FILES if rel in files_sha256})
    decision = {key: decision_config.get(key) for key in DECISION_IDENTITY_FIELDS}
    return {"files": files, "decision": decision}


def model_sha256(files_sha256: dict[str, str], decision_config: dict) -> str:
    return sha256_bytes(canonical_json(identity_payload(files_sha256, decision_config)))


def detect(root: Path) -> bool:
    try:
        manifest = read_json(root, MANIFEST_NAME)
    except PackageError:
        return (Path(root) / "decision_config.json").is_file() and (Path(root) / "readout.safetensors").is_file()
    return manifest.get("schema") == MANIFEST_SCHEMA


@dataclass
class Decision3Package:
    root: Path
    manifest: dict
    manifest_sha256: str
    config: dict
    decision_config: dict
    model_name: str
    repo_id: str | None
    model_sha256: str
    weight_files: list[str]
    text_prefix: str
    vision_prefix: str | None
    hidden_size: int
    max_input_tokens: int
    attention_mode: str
    temperature: float
    parameters: dict

    @property
    def family(self) -> str:
        return "decision3"

    @property
    def has_vision(self) -> bool:
        return self.vision_prefix is not None and "vision_config" in self.config

    @cached_property
    def processor_config(self) -> dict:
        """preprocessor_config.json (normalization and patching of images; videos use the same values)."""
        path = self.root / "preprocessor_config.json"
        config = read_json(self.root, "preprocessor_config.json") if path.is_file() else {}
        for key, want in (("patch_size", 16), ("temporal_patch_size", 2), ("merge_size", 2)):
            if config.get(key, want) != want:
                raise PackageError(f"{key} {config[key]} is not {want}, the only value this runtime reads", "preprocessor_config.json")
        return {"image_mean": config.get("image_mean", [0.5] * 3), "image_std": config.get("image_std", [0.5] * 3)}


def verify(root: Path) -> Decision3Package:
    root = Path(root)
    manifest = read_json(root, MANIFEST_NAME)
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise PackageError(f"schema {manifest.get('schema')!r} is not {MANIFEST_SCHEMA}", MANIFEST_NAME)
    files_sha256, files_bytes = manifest.get("files_sha256"), manifest.get("files_bytes")
    if not isinstance(files_sha256, dict) or not isinstance(files_bytes, dict) or set(files_sha256) != set(files_bytes):
        raise PackageError("files_sha256 and files_bytes must list the same files", MANIFEST_NAME)
    check_inventory(root, files_sha256, files_bytes)

    config = read_json(root, "config.json")
    if config.get("model_type") != "qwen3_5":
        raise PackageError(f"model_type {config.get('model_type')!r} is not qwen3_5", "config.json")
    text_config = config.get("text_config") or {}
    if text_config.get("model_type") != "qwen3_5_text":
        raise PackageError("text_config.model_type must be qwen3_5_text", "config.json")
    hidden = text_config.get("hidden_size")
    decision = read_json(root, "decision_config.json")
    _check_decision_config(decision)

    identity = manifest.get("identity") or {}
    actual = model_sha256(files_sha256, decision)
    if identity.get("model_sha256") != actual:
        raise PackageError(f"identity model_sha256 {actual} differs from the manifest's {identity.get('model_sha256')}", MANIFEST_NAME)

    weights = weight_files(files_sha256)
    if not weights:
        raise PackageError("no model.safetensors (or shards) in the package", MANIFEST_NAME)
    text_count, vision_count, text_prefix, vision_prefix = _count_weights(root, weights)
    readout = safetensors_header(root / "readout.safetensors", "readout.safetensors")
    if set(readout) != {"weight"} or readout["weight"]["shape"] != [NUM_CODES, hidden]:
        raise PackageError(f"readout must hold one tensor 'weight' of shape [255, {hidden}]", "readout.safetensors")
    want_dtype = "F32" if decision.get("readout_dtype", "float32") == "float32" else "BF16"
    if readout["weight"]["dtype"] != want_dtype:
        raise PackageError(f"readout weight is {readout['weight']['dtype']}, decision_config says {want_dtype}", "readout.safetensors")
    parameters = manifest.get("parameters") or {}
    counted = {"text": text_count, "vision": vision_count, "readout": NUM_CODES * hidden}
    counted["loaded"] = sum(counted.values())
    for key, value in counted.items():
        if parameters.get(key) != value:
            raise PackageError(f"parameters.{key} is {parameters.get(key)}, the weights hold {value}", MANIFEST_NAME)

    max_length = decision.get("max_length")
    max_input = max_length if max_length is not None else text_config.get("max_position_embeddings", 32768)
    if manifest.get("max_input_tokens") not in (None, max_length, max_input):
        raise PackageError("max_input_tokens differs from decision_config max_length", MANIFEST_NAME)
    package = Decision3Package(
        root=root,
        manifest=manifest,
        manifest_sha256=sha256_file(root / MANIFEST_NAME),
        config=config,
        decision_config=decision,
        model_name=str(manifest.get("model_name")),
        repo_id=manifest.get("repo_id"),
        model_sha256=actual,
        weight_files=weights,
        text_prefix=text_prefix,
        vision_prefix=vision_prefix,
        hidden_size=int(hidden),
        max_input_tokens=int(max_input),
        attention_mode=decision["attention_mode"],
        temperature=float(decision["temperature"]),
        parameters=counted,
    )
    if package.has_vision:
        package.processor_config  # checked when the package opens, not at its first media request
    return package


def _check_decision_config(decision: dict) -> None:
    rel = "decision_config.json"
    if decision.get("format_version") != 1 or decision.get("format_id") != FORMAT_ID:
        raise PackageError(f"format must be {FORMAT_ID} version 1", rel)
    if decision.get("prompt") != "d3":
        raise PackageError(f"prompt family {decision.get('prompt')!r} is not d3", rel)
    codes, token_ids = decision.get("codes"), decision.get("token_ids")
    if not isinstance(codes, list) or len(codes) != NUM_CODES or len(set(codes)) != NUM_CODES:
        raise PackageError("codes must list 255 distinct strings", rel)
    if not isinstance(token_ids, list) or len(token_ids) != NUM_CODES or len(set(token_ids)) != NUM_CODES:
        raise PackageError("token_ids must list 255 distinct ids", rel)
    temperature = decision.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise PackageError("temperature must be a positive number", rel)
    if decision.get("attention_mode") not in ATTENTION_MODES:
        raise PackageError(f"attention_mode must be one of {ATTENTION_MODES}", rel)
    if decision.get("pooling", "last") != "last":
        raise PackageError("pooling must be 'last'", rel)
    if decision.get("readout_dtype", "float32") not in ("float32", "bfloat16"):
        raise PackageError("readout_dtype must be float32 or bfloat16", rel)
    max_length = decision.get("max_length")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 16):
        raise PackageError("max_length must be null or an integer >= 16", rel)


def _count_weights(root: Path, weights: list[str]) -> tuple[int, int, str, str | None]:
    import math

    text = vision = 0
    prefixes: set[str] = set()
    for rel in weights:
        for key, entry in safetensors_header(root / rel, rel).items():
            if key.startswith(TEXT_PREFIXES):
                prefix = "model.language_model." if key.startswith("model.") else "language_model."
                text += math.prod(entry["shape"])
            elif key.startswith(VISION_PREFIXES):
                prefix = "model.visual." if key.startswith("model.") else "visual."
                vision += math.prod(entry["shape"])
            else:
                raise PackageError(f"tensor {key!r} has no language_model. / visual. prefix", rel)
            prefixes.add(prefix)
    nested = {p.startswith("model.") for p in prefixes}
    if len(nested) > 1:
        raise PackageError("weights mix model.-prefixed and bare prefixes", weights[0])
    outer = "model." if nested == {True} else ""
    has_vision = any("visual" in p for p in prefixes)
    return text, vision, f"{outer}language_model.", (f"{outer}visual." if has_vision else None)
