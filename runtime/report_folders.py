"""Where `bench`, `parity` and `selftest` write their reports: a folder of their own, checked before any work
(a run can take hours), each file replaced whole so an earlier report is never left half-written."""

from __future__ import annotations

import io
import os
from pathlib import Path

from vllm_sr_runtime.artifacts import enclosing_verified_folder


def prepare_report_folder(out: Path, command: str) -> Path:
    """Create `out` for `command`'s reports, or say why it cannot be used, before the command does any work."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: {command} writes a folder of reports there; give a folder")
    enclosing = enclosing_verified_folder(out)
    if enclosing is not None:
        folder, marker, what = enclosing
        where = "is" if folder == out.resolve() else f"is inside {folder},"
        raise ValueError(
            f"--out {out} {where} {what} ({marker} lists every file it holds): {command}'s reports there would "
            f"make it fail verification; give a folder of its own"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as problem:
        raise ValueError(f"--out {out} cannot be created: {problem.strerror or problem}") from problem
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} is not writable: {command} writes its reports there; give a writable folder")
    return out


def write_report_file(path: Path, data: str | bytes) -> None:
    """Write `path` whole: readers see the earlier file or this one, never a part."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        if isinstance(data, str):
            partial.write_text(data, encoding="utf-8")
        else:
            partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def figure_png(figure) -> bytes:
    """A matplotlib figure as the PNG bytes every report embeds or writes (the figure is closed)."""
    import matplotlib.pyplot as plt

    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return image.getvalue()
