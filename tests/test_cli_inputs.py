"""What a command is given is checked before any model is loaded or server started. Impossible numbers are
refused while the command line is parsed (exit 2, naming the flag): a bench with 0 repeats died in an IndexError
after loading, 0 questions in a KeyError, a parity gate outside 0..1 could never fail (or always did), serve
--workers 0 ran a master that answered nothing."""

from __future__ import annotations

import re

import pytest

from vllm_sr_runtime.cli import build_parser

REFUSED = [
    (["bench", "pkg", "--repeats", "0"], "--repeats: must be >= 1, not 0"),
    (["bench", "pkg", "--questions", "1,0"], "--questions: must be >= 1, not 0"),
    (["bench", "pkg", "--lengths", "abc"], "--lengths: must be a whole number, not 'abc'"),
    (["bench", "pkg", "--lengths", ","], "--lengths: needs at least one number"),
    (["bench", "--mode", "http", "--url", "u", "--duration", "0"], "--duration: must be > 0, not 0.0"),
    # bench --profiles: a misspelt one failed after the others had loaded, an empty list in a StopIteration
    (["bench", "pkg", "--profiles", "exact,fast"], "--profiles: unknown profile(s) fast (one of "),
    (["bench", "pkg", "--profiles", ","], "--profiles: needs at least one profile"),
    (["bench", "pkg", "--profiles", "exact,exact"], "--profiles: a profile is named twice"),
    (["parity", "pkg", "--max-changed-rate", "2"], "--max-changed-rate: must be in 0..1, not 2.0"),
    (["parity", "pkg", "--max-abs-diff", "-1"], "--max-abs-diff: must be in 0..1, not -1.0"),
    (["parity", "pkg", "--profile", "fast"], "--profile: invalid choice: 'fast'"),  # was: after the reference model loaded
    (["selftest", "--clients", "0"], "--clients: must be >= 1, not 0"),
    # selftest: an empty list checked nothing and said passed; a misspelt dtype failed after the fixtures were written
    (["selftest", "--fixtures", ","], "--fixtures: needs at least one fixture"),
    (["selftest", "--fixtures", "d3,foo"], "--fixtures: unknown fixture(s) foo (one of d2-qwen3, "),
    (["selftest", "--dtypes", "int4"], "--dtypes: unknown dtype(s) int4 (one of fp32, fp16, bf16, int8)"),
    (["export", "pkg", "--out", "a", "--lengths", "128,x"], "--lengths: must be a whole number, not 'x'"),
    # export --opset: below 18 was a KeyError from torch.onnx after the trace, 26 the ONNX checker's refusal
    (["export", "pkg", "--out", "a", "--opset", "17"], "--opset: must be in 18..25, not 17"),
    (["export", "pkg", "--out", "a", "--opset", "26"], "--opset: must be in 18..25, not 26"),
    # fixture: a readout scale of 0 answers every question uniformly, a negative one inverts every answer
    (["fixture", "--family", "decision3", "--readout-scale", "0", "--out", "x"], "--readout-scale: must be > 0, not 0.0"),
    (["fixture", "--family", "decision3", "--layers", "0", "--out", "x"], "--layers: must be >= 1, not 0"),
    # serve: not gunicorn's traceback (a port past 65535), a master with no worker, or a queue that 429s everything
    (["serve", "pkg", "--port", "99999"], "--port: must be in 0..65535, not 99999"),
    (["serve", "pkg", "--workers", "0"], "--workers: must be >= 1, not 0"),
    (["serve", "pkg", "--deadline-ms", "700000"], "--deadline-ms: must be in 1..600000, not 700000"),  # else every request 400s
    (["serve", "pkg", "--max-queue", "0"], "--max-queue: must be >= 1, not 0"),
    (["serve", "pkg", "--max-queued-tokens", "0"], "--max-queued-tokens: must be >= 1, not 0"),
    (["serve", "pkg", "--batch-window-ms", "-1"], "--batch-window-ms: must be >= 0, not -1.0"),
    (["serve", "pkg", "--media-url-timeout", "0"], "--media-url-timeout: must be > 0, not 0.0"),
    (["serve", "pkg", "--result-cache-entries", "-1"], "--result-cache-entries: must be >= 0, not -1"),
    (["serve", "pkg", "--media-slots", "0"], "--media-slots: must be >= 1, not 0"),  # 0 would refuse every image
]


@pytest.mark.parametrize("argv, says", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_an_impossible_number_is_refused_while_parsing(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_lists_and_defaults_parse_to_numbers():
    bench = build_parser().parse_args(["bench", "pkg", "--lengths", "128, 512,", "--repeats", "3"])
    assert bench.lengths == [128, 512] and bench.questions == [1, 8] and bench.concurrency == [1, 8, 64] and bench.repeats == 3
    parity = build_parser().parse_args(["parity", "pkg", "--max-changed-rate", "0", "--max-abs-diff", "1"])
    assert (parity.max_changed_rate, parity.max_abs_diff) == (0.0, 1.0)
    assert build_parser().parse_args(["parity", "pkg"]).max_changed_rate is None  # no flag: the dtype's default gate
    assert build_parser().parse_args(["selftest"]).lengths == [128, 512, 2048]
    assert build_parser().parse_args(["export", "pkg", "--out", "a", "--lengths", "128,256"]).lengths == [128, 256]
    serve = build_parser().parse_args(["serve", "--port", "0", "--result-cache-entries", "0", "--batch-window-ms", "0"])
    assert (serve.port, serve.result_cache_entries, serve.batch_window_ms, serve.workers) == (0, 0, 0.0, 1)
    from vllm_sr_runtime.commands.serve_cmd import build_config

    assert build_config(build_parser().parse_args(["serve", "pkg", "--media-slots", "3"])).media_slots == 3
    assert build_config(build_parser().parse_args(["serve", "pkg"])).media_slots == 8
    assert build_config(build_parser().parse_args(["serve", "pkg", "--graceful-timeout", "5"])).graceful_timeout == 5


def test_a_request_file_is_checked_line_by_line_before_any_model_is_loaded(tmp_path, capsys):
    """parity --suite FILE: a missing file, a line that is not JSON, or a line whose questions the server would
    refuse is named (file:line) before the models load (an unreadable file raised a bare FileNotFoundError after
    loading both, an invalid question stopped the run midway without its line)."""
    from vllm_sr_runtime.cli import main
    from vllm_sr_runtime.request_files import load_jsonl

    good = '{"state": "s", "questions": {"a": {"type": "noul"}}}'
    cases = {
        "missing.jsonl": (None, "missing.jsonl: cannot be read (No such file or directory)"),
        "text.jsonl": (f"{good}\nnot json\n", "text.jsonl:2: not JSON"),
        "type.jsonl": (f"{good}\n\n" + '{"state": "s", "questions": {"a": {"type": "bogus"}}}\n', "type.jsonl:3: questions['a'].type must be one of choice, noul, score, got 'bogus'"),
        "options.jsonl": ('{"state": "s", "questions": {"c": {"type": "choice", "criteria": {"only": null}}}}\n', "options.jsonl:1: questions['c']: a choice needs 2..255 options, got 1"),
    }
    for name, (text, says) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        # A model that does not exist: the refusal is about the file, so it came before the model was looked at.
        assert main(["parity", str(tmp_path / "no-such-model"), "--suite", str(path), "--out", str(tmp_path / "report"), "--quiet"]) == 2
        assert says in capsys.readouterr().err
    (tmp_path / "fine.jsonl").write_text(f"{good}\n")
    assert [request.questions for request in load_jsonl(tmp_path / "fine.jsonl")] == [{"a": {"type": "noul"}}]


def test_serve_without_a_model_says_when_the_cache_cannot_hold_the_default_package(tmp_path, capsys):
    """A --cache-dir that is a file: one line naming the cache and the ways out, not the child writer's traceback
    followed by the parent's CalledProcessError."""
    from vllm_sr_runtime.cli import main

    cache = tmp_path / "cache"
    cache.write_text("a file, not a folder")
    assert main(["serve", "--cache-dir", str(cache), "--port", "0"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [f"error: no model given, and the cache {cache} cannot hold the default synthetic package (Not a directory): give a model, or a writable --cache-dir (or VLLM_SR_RUNTIME_CACHE_DIR)"]
    assert cache.read_text() == "a file, not a folder"


def test_bench_http_refuses_an_address_where_nothing_answers(tmp_path, capsys):
    """Not a table of rps 0.000 whose every request was a connection error."""
    import socket

    from vllm_sr_runtime.cli import main

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: nothing listens there
    assert main(["bench", "--mode", "http", "--url", url, "--duration", "1", "--out", str(tmp_path / "bench"), "--quiet"]) == 2
    assert f"error: nothing answers HTTP at {url}" in capsys.readouterr().err
    assert not (tmp_path / "bench" / "bench.json").exists()


def marked_artifact(folder):
    """A folder that says it is an artifact (serve's first check reads no further)."""
    folder.mkdir()
    (folder / "artifact.json").write_text("{}")
    return folder


def test_serve_refuses_a_model_it_could_never_load_before_any_worker_starts(packages, tmp_path, monkeypatch, capsys):
    """A misspelt path, profile or device, an artifact folder given as the model, an unpinned revision, a missing
    artifact or base checkpoint: before, gunicorn started, the worker's load failed, and the server answered 503
    until someone read /health. Now the master names every one, one line each, and exits."""
    from vllm_sr_runtime.cli import main
    from vllm_sr_runtime.server import gunicorn_app

    monkeypatch.setattr(gunicorn_app.ServeApplication, "run", lambda self: pytest.fail("a server started"))
    artifact = marked_artifact(tmp_path / "artifact")
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n"
        f"  - model: {tmp_path / 'nope'}\n    profile: fast\n    device: gpu:0\n    artifact: {tmp_path / 'nope'}\n"
        f"  - model: vllm-sr/d3-nano@main\n    name: pinned\n"
        f"  - model: {packages['d3']}\n    device: auto:1\n"
        f"  - model: {artifact}\n    name: exported\n"
        f"  - model: vllm-sr/d3-nano\n    base_path: {tmp_path / 'no-base'}\n"
        f"  - model: someone/else@abc\n"
        f"  - model: {packages['d3']}\n    artifact: {artifact}\n    name: eager\n"
    )
    assert main(["serve", "--models", str(models), "--port", "0"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "error: serve refuses to start:"
    expected = [
        f"model {tmp_path / 'nope'}: no such local package directory",
        f"model {tmp_path / 'nope'}: unknown profile 'fast' (one of ",
        f"model {tmp_path / 'nope'}: device 'gpu:0' is not one of auto, cpu, cuda, rocm",
        f"model {tmp_path / 'nope'}: artifact: {tmp_path / 'nope'} is not an artifact (no artifact.json)",
        "model vllm-sr/d3-nano@main: revision must be a commit (40 hex) or a prefix of at least 8 hex digits, got 'main'",
        f"model {packages['d3']}: auto takes no device index",
        f"model {artifact}: an exported artifact, not a model package",
        f"model vllm-sr/d3-nano: base checkpoint {tmp_path / 'no-base'}: no such directory",
        "model someone/else@abc: revision must be a 40-hex commit, got 'abc'",
        f"model {packages['d3']}: artifact {artifact}: profile exact runs no artifact (it runs torch): use it with profile batching | max_speed | shared_context",
    ]
    assert len(lines) == 1 + len(expected)
    for line, start in zip(lines[1:], expected):
        assert line.strip().startswith(start), (line, start)

    # One problem is one line; the command line's own model and flags are checked the same way.
    assert main(["serve", str(tmp_path / "nope"), "--port", "0"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"error: model {tmp_path / 'nope'}: no such local package directory, and not a Hub repo id (owner/name): {tmp_path / 'nope'}"
    )
    assert main(["serve", str(packages["d3"]), "--device", "gpu", "--port", "0"]) == 1
    assert "device 'gpu' is not one of auto" in capsys.readouterr().err
    long_socket = tmp_path / ("s" * 120) / "serve.sock"  # gunicorn retried five times, then "AF_UNIX path too long"
    assert main(["serve", str(packages["d3"]), "--uds", str(long_socket)]) == 1
    assert f"error: --uds {long_socket} is {len(str(long_socket))} bytes; a Unix socket path may be at most 107" in capsys.readouterr().err


def test_an_artifact_given_to_a_profile_that_runs_none_is_refused_not_ignored(packages, tmp_path, capsys):
    """load(..., artifact=A) under exact answered from eager PyTorch, the artifact silently unused."""
    import vllm_sr_runtime
    from vllm_sr_runtime.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="profile exact runs no artifact"):
        vllm_sr_runtime.load(packages["d3"], artifact=marked_artifact(tmp_path / "artifact"))
    from vllm_sr_runtime.cli import main

    # bench and parity say so before they load anything (the package named here does not exist); bench forward
    # without a package was a TypeError, an artifact path that is not there went unnoticed under exact
    bench = ["bench", str(tmp_path / "nope"), "--out", str(tmp_path / "bench"), "--quiet"]
    assert main([*bench, "--profiles", "exact,batching", "--artifact", str(tmp_path / "artifact")]) == 2
    assert "error: --artifact: no profile in --profiles exact,batching runs it" in capsys.readouterr().err
    assert main([*bench, "--profiles", "exact", "--artifact", str(tmp_path / "missing")]) == 1
    assert f"error: {tmp_path / 'missing'} is not an artifact" in capsys.readouterr().err
    assert main(["bench", "--out", str(tmp_path / "bench"), "--quiet"]) == 2
    assert "error: --mode forward needs a package" in capsys.readouterr().err
    assert main(["parity", str(tmp_path / "nope"), "--profile", "exact", "--artifact", str(tmp_path / "artifact"), "--out", str(tmp_path / "report")]) == 2
    assert "error: --artifact: profile exact runs no artifact" in capsys.readouterr().err


def test_what_serve_checks_first_lets_every_loadable_model_through(packages, tmp_path):
    """A local package, a pinned release by prefix (not downloaded here: the Hub is reached only by the worker), a
    full commit outside the table, a bare string entry, GPU device names this host lacks (whether one is visible
    is the worker's to say), an artifact folder."""
    from vllm_sr_runtime.cli import build_parser
    from vllm_sr_runtime.commands.serve_cmd import build_config
    from vllm_sr_runtime.server.preflight import check_models

    artifact = marked_artifact(tmp_path / "artifact")
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n  - {packages['d2_qwen3']}\n  - model: vllm-sr/d3-nano@6601b4d139\n    device: cuda:3\n"
        f"  - model: someone/else\n    revision: {'a' * 40}\n    device: rocm\n"
        f"  - model: {packages['d3']}\n    profile: max_speed\n    artifact: {artifact}\n    name: fast\n"
    )
    config = build_config(build_parser().parse_args(["serve", "--models", str(models), str(packages["d3"])]))
    assert [spec.model for spec in config.models] == [str(packages["d2_qwen3"]), "vllm-sr/d3-nano@6601b4d139", "someone/else", str(packages["d3"]), str(packages["d3"])]
    check_models(config)


EXPORT_OPTIONS_REFUSED = [
    (["--int8-activations", "tensor", "--int8-target", "0.1"], "--int8-activations, --int8-target: for --dtype int8 only (this export is fp32)"),
    (["--dtype", "fp16", "--int8-weight-bits", "7"], "--int8-weight-bits: for --dtype int8 only (this export is fp16)"),
    (["--lengths", "128"], "--lengths are the portable variant's static-length graphs"),
]


@pytest.mark.parametrize("argv, says", EXPORT_OPTIONS_REFUSED, ids=[" ".join(a) for a, _ in EXPORT_OPTIONS_REFUSED])
def test_an_export_option_that_would_do_nothing_is_refused_before_the_package_is_read(argv, says, tmp_path, capsys):
    """int8 options with another dtype, and --lengths with the contrib variant, were silently unused: the artifact was
    not what the command line said. The package named here does not exist, so the refusal must come first."""
    from vllm_sr_runtime.cli import main

    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "artifact"), *argv]) == 2
    assert f"error: {says}" in capsys.readouterr().err
    assert not (tmp_path / "artifact").exists()


def test_a_models_file_value_that_yaml_does_not_read_as_text_is_refused(tmp_path):
    """`revision: 01234567` is the octal number 342391 to YAML, and `name: yes` is true: they became the revision
    '342391' (refused as unpinned, naming a revision nobody wrote) and the model name 'True'."""
    from vllm_sr_runtime.errors import InvalidRequest
    from vllm_sr_runtime.server.config import load_models_file

    models = tmp_path / "models.yaml"
    for entry, says in (
        ("revision: 01234567", "entry 0 revision is not text (YAML read it as int 342391): quote it"),
        ("name: yes", "entry 0 name is not text (YAML read it as bool True): quote it"),
        ("accept_licences: CC-BY-NC-4.0", "entry 0 'accept_licences' must be a list of SPDX ids"),
    ):
        models.write_text(f"models:\n  - model: vllm-sr/d3-nano\n    {entry}\n")
        with pytest.raises(InvalidRequest, match=re.escape(says)):
            load_models_file(str(models))
    models.write_text('models:\n  - model: vllm-sr/d3-nano\n    revision: "01234567"\n    name: "yes"\n')
    [spec] = load_models_file(str(models))
    assert (spec.revision, spec.name) == ("01234567", "yes")
    models.write_text("models:\n  - model: vllm-sr/d3-nano\n    accept_licences: [CC-BY-NC-4.0]\n")
    assert load_models_file(str(models))[0].accept_licences == ("CC-BY-NC-4.0",)


@pytest.fixture()
def loads(monkeypatch) -> list[str]:
    """The profile of every vllm_sr_runtime.load call, in order (each still loads)."""
    import vllm_sr_runtime

    profiles: list[str] = []
    real_load = vllm_sr_runtime.load
    monkeypatch.setattr(vllm_sr_runtime, "load", lambda *args, **kwargs: profiles.append(kwargs["profile"]) or real_load(*args, **kwargs))
    return profiles


def test_bench_media_on_a_model_without_a_vision_tower_stops_after_the_first_load(packages, tmp_path, loads, capsys):
    """It loaded every profile, then failed on the first timed request."""
    from vllm_sr_runtime.cli import main

    argv = ["bench", str(packages["d3"]), "--profiles", "exact,batching", "--media", "image", "--out", str(tmp_path / "bench"), "--quiet"]
    assert main(argv) == 2
    assert "error: --media image: synthetic-d3-tiny-s0 has no vision tower" in capsys.readouterr().err
    assert loads == ["exact"]


def test_parity_refuses_what_it_cannot_compare_before_the_candidate_loads(packages, tmp_path, loads, capsys):
    """A media suite for a model without a vision tower failed on its first request after both models loaded;
    --close-call-margin against another reference than exact failed after both loaded too."""
    from vllm_sr_runtime.cli import main

    suite = tmp_path / "media.jsonl"
    suite.write_text('{"state": "x", "questions": {"q": {"type": "noul"}}, "images": ["data:image/png;base64,iVBORw0KGgo="]}\n')
    out = ["--out", str(tmp_path / "parity"), "--quiet"]
    assert main(["parity", str(packages["d3"]), "--profile", "batching", "--suite", str(suite), *out]) == 2
    assert "has images or videos and synthetic-d3-tiny-s0 has no vision tower" in capsys.readouterr().err
    assert loads == ["exact"]
    assert main(["parity", str(packages["d3"]), "--against", "batching", "--close-call-margin", "0.1", *out]) == 2
    assert "compare --against exact" in capsys.readouterr().err
    assert loads == ["exact"]


def test_a_reader_that_goes_away_stops_the_command_quietly():
    """`vllm-sr-runtime models | head` printed a BrokenPipeError traceback; a closed pipe is how a shell says
    "enough", and the command now stops as a shell tool does (141, nothing on stderr)."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        result = subprocess.run(
            [sys.executable, "-m", "vllm_sr_runtime.cli", "models"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 141


def test_every_option_of_every_command_says_what_it_does():
    """`--help` explains each flag (several said nothing: --offline, --cache-dir, --out, --device, ...)."""
    import argparse

    [commands] = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    silent = {
        f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
        for name, parser in commands.choices.items()
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    }
    assert not silent, sorted(silent)
    assert "offline" in {action.dest for action in commands.choices["bench"]._actions}  # it loads packages as the others do
