"""File inventory and hashing for package verification."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from vllm_sr_runtime.errors import PackageError

MANIFEST_NAME = "MODEL_MANIFEST.json"
ARTIFACT_FILE = "artifact.json"  # an exported artifact's manifest (it carries its package's MANIFEST_NAME too)
# Files a Hub checkout or cache adds that are not part of a package.
GOLDEN_FILE = "golden_answers.json"  # bound to the package by its identity (model_sha256), not listed in its manifest
IGNORED_NAMES = {".gitattributes", GOLDEN_FILE}
IGNORED_DIRS = {".git", ".cache", ".huggingface"}


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def canonical_text(value: object) -> str:
    """Sorted keys, compact separators, no ASCII escaping: JSON's one canonical form (identity hashes, and the
    prompts that embed JSON values)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: object) -> bytes:
    """canonical_text as UTF-8: the form every identity hash is taken over."""
    return canonical_text(value).encode()


def _containment_root(root: Path) -> Path:
    """Symlinks may point inside the package, or inside its HF cache repo folder (snapshots -> blobs)."""
    resolved = root.resolve()
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        return resolved.parent.parent
    return resolved


def list_package_files(root: Path) -> dict[str, Path]:
    """Every file of the package as {posix relative path: path}, refusing links that leave it."""
    root = Path(root)
    if not root.is_dir():
        raise PackageError("package directory does not exist", str(root))
    boundary = _containment_root(root)
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        current = Path(dirpath)
        kept = []
        for name in sorted(dirnames):
            if name in IGNORED_DIRS and current == root:
                continue
            sub = current / name
            if sub.is_symlink():
                _check_link(sub, boundary, root)
                raise PackageError("symlinked directories are not allowed in a package", sub.relative_to(root).as_posix())
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = current / name
            rel = path.relative_to(root).as_posix()
            if current == root and name in IGNORED_NAMES:
                continue
            if path.is_symlink():
                _check_link(path, boundary, root)
            if not path.is_file():
                raise PackageError("not a regular file", rel)
            found[rel] = path
    return found


def _check_link(path: Path, boundary: Path, root: Path) -> None:
    target = path.resolve()
    if not target.is_relative_to(boundary):
        raise PackageError(f"symlink points outside the package (to {target})", path.relative_to(root).as_posix())


def check_inventory(
    root: Path,
    expected_sha256: dict[str, str],
    expected_bytes: dict[str, int] | None = None,
    *,
    manifest_name: str = MANIFEST_NAME,
) -> dict[str, Path]:
    """The files on disk must be exactly the manifest's (plus the manifest), each with its size and hash."""
    on_disk = list_package_files(root)
    expected = set(expected_sha256) | {manifest_name}
    missing = sorted(expected - set(on_disk))
    if missing:
        raise PackageError("file listed in the manifest is missing", missing[0])
    extra = sorted(set(on_disk) - expected)
    if extra:
        raise PackageError("file is not listed in the manifest", extra[0])
    for rel in sorted(expected_sha256):
        path = on_disk[rel]
        if expected_bytes is not None:
            want = expected_bytes.get(rel)
            if want is None:
                raise PackageError("manifest lists no size for this file", rel)
            size = path.stat().st_size
            if size != want:
                raise PackageError(f"size {size} bytes differs from the manifest's {want}", rel)
        actual = sha256_file(path)
        if actual != expected_sha256[rel]:
            raise PackageError(f"sha256 {actual} differs from the manifest's {expected_sha256[rel]}", rel)
    return on_disk


def read_json(root: Path, rel: str) -> dict:
    path = Path(root) / rel
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PackageError("required file is missing", rel) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(f"not valid JSON ({exc})", rel) from None
    if not isinstance(data, dict):
        raise PackageError("must hold a JSON object", rel)
    return data
