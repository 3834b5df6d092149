"""Impossible numbers on the command line are refused while it is parsed (exit 2, naming the flag), before any
model is loaded or server started: a bench with 0 repeats died in an IndexError after loading, 0 questions in a
KeyError, a parity gate outside 0..1 could never fail (or always did), serve --workers 0 ran a master that answered
nothing."""

from __future__ import annotations

import pytest

from vllm_sr_runtime.cli import build_parser

REFUSED = [
    (["bench", "pkg", "--repeats", "0"], "--repeats: must be >= 1, not 0"),
    (["bench", "pkg", "--questions", "1,0"], "--questions: must be >= 1, not 0"),
    (["bench", "pkg", "--lengths", "abc"], "--lengths: must be a whole number, not 'abc'"),
    (["bench", "pkg", "--lengths", ","], "--lengths: needs at least one number"),
    (["bench", "--mode", "http", "--url", "u", "--duration", "0"], "--duration: must be > 0, not 0.0"),
    (["parity", "pkg", "--max-changed-rate", "2"], "--max-changed-rate: must be in 0..1, not 2.0"),
    (["parity", "pkg", "--max-abs-diff", "-1"], "--max-abs-diff: must be in 0..1, not -1.0"),
    (["selftest", "--clients", "0"], "--clients: must be >= 1, not 0"),
    (["export", "pkg", "--out", "a", "--lengths", "128,x"], "--lengths: must be a whole number, not 'x'"),
    # serve: not gunicorn's traceback (a port past 65535), a master with no worker, or a queue that 429s everything
    (["serve", "pkg", "--port", "99999"], "--port: must be in 0..65535, not 99999"),
    (["serve", "pkg", "--workers", "0"], "--workers: must be >= 1, not 0"),
    (["serve", "pkg", "--max-queue", "0"], "--max-queue: must be >= 1, not 0"),
    (["serve", "pkg", "--batch-window-ms", "-1"], "--batch-window-ms: must be >= 0, not -1.0"),
    (["serve", "pkg", "--media-url-timeout", "0"], "--media-url-timeout: must be > 0, not 0.0"),
    (["serve", "pkg", "--result-cache-entries", "-1"], "--result-cache-entries: must be >= 0, not -1"),
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
