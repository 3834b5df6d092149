"""Artifact directories: written to a temporary sibling and renamed into place; verified by hashes on load."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from vllm_sr_runtime.errors import ArtifactError
from vllm_sr_runtime.packages.files import ARTIFACT_FILE, MANIFEST_NAME, list_package_files, sha256_file

ARTIFACT_SCHEMA = "vllm-sr-runtime-artifact/1"
PARTIAL_MARK = ".partial-"
# Folders whose manifest lists every file they hold: anything written into one (or into a folder under it) makes the
# package fail verification, or the artifact its check, at the next load.
VERIFIED_FOLDERS = ((ARTIFACT_FILE, "an exported artifact"), (MANIFEST_NAME, "a model package"))  # an artifact holds a package manifest too


def enclosing_verified_folder(path: Path) -> tuple[Path, str, str] | None:
    """The model package or artifact that `path` is, or is inside: (its folder, its manifest's name, what it is)."""
    resolved = Path(path).resolve()
    for folder in (resolved, *resolved.parents):
        for marker, what in VERIFIED_FOLDERS:
            if (folder / marker).is_file():
                return folder, marker, what
    return None


def file_inventory(root: Path) -> dict[str, dict]:
    return {
        rel: {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        for rel, path in sorted(list_package_files(root).items())
        if rel != ARTIFACT_FILE
    }


def write_manifest(root: Path, manifest: dict) -> None:
    manifest = {**manifest, "files": file_inventory(root)}
    (root / ARTIFACT_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def check_artifact_folder(root: Path) -> Path:
    """`root/artifact.json`, refused when it is not there (a quick check: read_artifact verifies the files)."""
    path = Path(root) / ARTIFACT_FILE
    if not path.is_file():
        raise ArtifactError(f"{root} is not an artifact (no {ARTIFACT_FILE})")
    return path


def read_artifact(root: Path) -> dict:
    """The artifact's manifest after checking every file's size and hash (and that nothing is extra)."""
    root = Path(root)
    path = check_artifact_folder(root)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
    if manifest.get("schema") != ARTIFACT_SCHEMA:
        raise ArtifactError(f"{path}: schema {manifest.get('schema')!r} is not {ARTIFACT_SCHEMA}")
    expected = manifest.get("files") or {}
    on_disk = {rel for rel in list_package_files(root) if rel != ARTIFACT_FILE}
    if on_disk != set(expected):
        extra, missing = sorted(on_disk - set(expected)), sorted(set(expected) - on_disk)
        raise ArtifactError(f"{root}: files differ from {ARTIFACT_FILE} (missing {missing[:3]}, extra {extra[:3]})")
    for rel, entry in expected.items():
        file = root / rel
        if file.stat().st_size != entry["bytes"] or sha256_file(file) != entry["sha256"]:
            raise ArtifactError(f"{root / rel}: size or sha256 differs from {ARTIFACT_FILE}")
    return manifest


def _remove_stale_partials(out: Path) -> None:
    for stale in out.parent.glob(f".{out.name}{PARTIAL_MARK}*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def inside_verified_folder(out: Path) -> str | None:
    """Why a folder may not be written at `out`: it would be inside a model package or an artifact (`out` itself
    may be one that an earlier write of the same kind left); None when it would not."""
    enclosing = enclosing_verified_folder(Path(out).absolute().parent)
    if enclosing is None:
        return None
    folder, marker, what = enclosing
    return f"{out} is inside {folder}, {what} ({marker} lists every file it holds): writing there would make it fail verification; choose a folder outside it"


def replaceable_folder(out: Path, written_earlier: Callable[[Path], bool]) -> bool:
    """Whether a write may replace `out` as a whole: nothing is there, or an empty folder, or a folder that
    `written_earlier` says an earlier write of the same kind left; never a file, a symbolic link or anything else."""
    out = Path(out)
    if out.is_symlink():
        return False
    if not out.exists():
        return True
    return out.is_dir() and (not any(out.iterdir()) or written_earlier(out))


def check_replaceable(out: Path, replaces: str | None = ARTIFACT_FILE) -> None:
    """An existing `out` is replaced as a whole, so it must be an empty folder or one holding `replaces` (what an
    earlier write of the same kind left: an artifact's `artifact.json`); anything else (a file, the user's project
    folder, a model package, a folder of several artifacts) is refused before any work."""
    out = Path(out).absolute()
    if out.is_symlink():
        raise ArtifactError(f"{out} is a symbolic link: writing there would replace the link, not its target; give the folder it points to, or a new one")
    inside = inside_verified_folder(out)
    if inside:
        raise ArtifactError(inside)
    if replaceable_folder(out, lambda folder: replaces is not None and (folder / replaces).is_file()):
        return
    what = f"holds no {replaces}" if replaces else "is not empty"
    raise ArtifactError(
        f"{out} exists and {what}: writing there would replace it as a whole; choose a new folder, or remove this one first"
    )


@contextmanager
def atomic_directory(out: Path, replaces: str | None = ARTIFACT_FILE):
    """Yields a temporary directory next to `out`; on success it replaces `out` in one rename. On any failure
    (exception, SIGTERM, Ctrl-C) the temporary directory is removed and `out`, if it existed, is untouched. An
    existing `out` must be empty or hold `replaces` (`check_replaceable`), checked now and again before the rename."""
    out = Path(out).absolute()
    check_replaceable(out, replaces)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out)
    # named before it is made, and made under the SIGTERM handler: a signal that lands just after the mkdir still
    # finds it to remove (mkdtemp, before the handler and naming it only once made, left it behind)
    temp = out.parent / f".{out.name}{PARTIAL_MARK}{secrets.token_hex(8)}-{os.getpid()}"
    previous = signal.getsignal(signal.SIGTERM)

    def terminate(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    in_main = _is_main_thread()
    try:
        if in_main:
            signal.signal(signal.SIGTERM, terminate)
        temp.mkdir(mode=0o700)
        yield temp
        _publishable(temp)
        check_replaceable(out, replaces)
        backup = None
        if out.exists():
            backup = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, backup)
        os.rename(temp, out)
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _publishable(root: Path) -> None:
    """The partial folder is made private (0700); an artifact is read by other users (containers, read-only mounts)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(root, 0o777 & ~mask)
    for path in root.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


EXPORTER_GROUP = "vllm_sr_runtime.exporters"  # entry points: name -> callable(family, out, *, variant, dtype, progress)


def registered_exporter(name: str = "onnx"):
    """The exporter an installed distribution registers (the runtime never imports one: `max_speed` with no
    --artifact reaches it here to fill the artifact cache)."""
    from importlib.metadata import entry_points

    found = [entry for entry in entry_points(group=EXPORTER_GROUP) if entry.name == name]
    if not found:
        raise ArtifactError(
            f"no artifact exporter {name!r} is registered (entry point group {EXPORTER_GROUP}); install vllm-sr-runtime "
            "with its export dependencies, or pass --artifact"
        )
    return found[0].load()
