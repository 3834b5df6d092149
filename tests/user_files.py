"""What a user keeps where one of our commands might write: a folder of their own and a file. A refused write
leaves both as they were."""

from __future__ import annotations

from pathlib import Path

MINE = "mine"


def user_files(root: Path) -> list[Path]:
    """A non-empty folder of the user's and a file of the user's, under `root`."""
    project = root / "project"
    project.mkdir()
    (project / "notes.txt").write_text(MINE)
    a_file = root / "a_file"
    a_file.write_text(MINE)
    return [project, a_file]


def assert_untouched(paths: list[Path]) -> None:
    for path in paths:
        assert (path / "notes.txt" if path.is_dir() else path).read_text() == MINE, path
