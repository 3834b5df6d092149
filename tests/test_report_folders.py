"""bench, parity and selftest write their reports into a folder of their own: a file, a model package, an artifact
or any folder inside one is refused before any work, and a report file is replaced whole."""

from __future__ import annotations

import shutil

import pytest

from vllm_sr_runtime.cli import main
from vllm_sr_runtime.report_folders import write_report_file

COMMANDS = {
    "parity": lambda model, out: ["parity", model, "--out", out, "--quiet"],
    "bench": lambda model, out: ["bench", model, "--out", out, "--quiet"],
    "selftest": lambda model, out: ["selftest", "--out", out],
}


def tree(root):
    return sorted((str(path.relative_to(root)), path.stat().st_size) for path in root.rglob("*"))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_reports_never_go_into_a_package_an_artifact_or_a_file(command, packages, tmp_path, capsys):
    package = tmp_path / "package"
    shutil.copytree(packages["d3"], package)
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "artifact.json").write_text("{}")
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's notes\n")
    before = {path: tree(path) for path in (package, artifact)}
    cases = {
        package: "is a model package",
        package / "reports": "is inside",
        artifact: "is an exported artifact",
        notes: "is a file",
    }
    for out, says in cases.items():
        # A model that does not exist: the refusal names --out, so it came before the model was looked at.
        assert main(COMMANDS[command](str(tmp_path / "no-such-model"), str(out))) == 2
        error = capsys.readouterr().err
        assert f"--out {out}" in error and says in error and command in error, error
    assert {path: tree(path) for path in (package, artifact)} == before
    assert not (package / "reports").exists()
    assert notes.read_text() == "the user's notes\n"


def test_a_report_file_is_replaced_whole_or_not_at_all(tmp_path):
    report = tmp_path / "parity.json"
    write_report_file(report, '{"run": 1}\n')
    write_report_file(report, b'{"run": 2}\n')
    assert report.read_text() == '{"run": 2}\n'
    with pytest.raises(UnicodeEncodeError):
        write_report_file(report, '{"run": 3, "text": "\ud800"}\n')  # fails while the new bytes are written
    assert report.read_text() == '{"run": 2}\n'
    assert [path.name for path in tmp_path.iterdir()] == ["parity.json"]  # no partial file left beside it
