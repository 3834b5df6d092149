"""parity.json and a self-contained report.html (summary tables and plots embedded as PNG data URLs)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vllm_sr_runtime.report_folders import figure_png, write_report_file  # noqa: E402


def _png(figure) -> str:
    return "data:image/png;base64," + base64.b64encode(figure_png(figure)).decode()


FLOOR = 1e-12  # |Δp| plotted on log axes: an exact match is drawn here


def _gate_line(axis, max_abs_diff: float | None, vertical: bool = False) -> None:
    if max_abs_diff is None:
        return
    draw = axis.axvline if vertical else axis.axhline
    draw(max_abs_diff, color="#b00020", linestyle="--", linewidth=1, label=f"gate: max |Δp| {max_abs_diff:g}")
    axis.legend(loc="best", fontsize=8)


def plots(rows: list[dict], max_abs_diff: float | None = None) -> dict[str, str]:
    """The |Δp| histogram (log-spaced bins: the differences span orders of magnitude), |Δp| against prompt length and
    against the reference's margin; the |Δp| gate, where one applies, drawn on each."""
    scored = [r for r in rows if "max_abs_diff" in r]
    diffs = [max(r["max_abs_diff"], FLOOR) for r in scored]
    figures = {}
    figure, axis = plt.subplots(figsize=(6, 3.4))
    low, high = min(diffs + [max_abs_diff or 1.0]), max(diffs + [max_abs_diff or FLOOR])
    axis.hist(diffs, bins=np.geomspace(low / 1.5, high * 1.5, 41), color="#3b6ea5")
    axis.set_xscale("log")
    axis.set_xlabel("|Δp| (largest over the question's options)")
    axis.set_ylabel("questions")
    axis.set_title("|Δp| histogram")
    _gate_line(axis, max_abs_diff, vertical=True)
    figures["abs_diff_histogram"] = _png(figure)

    figure, axis = plt.subplots(figsize=(6, 3.4))
    axis.scatter([r["prompt_tokens"] for r in scored], diffs, s=8, alpha=0.6, color="#3b6ea5")
    axis.set_yscale("log")
    axis.set_xlabel("prompt tokens")
    axis.set_ylabel("|Δp|")
    axis.set_title("|Δp| against prompt length")
    _gate_line(axis, max_abs_diff)
    figures["abs_diff_vs_length"] = _png(figure)

    figure, axis = plt.subplots(figsize=(6, 3.4))
    kept = [r for r in scored if not r["decision_changed"]]
    changed = [r for r in scored if r["decision_changed"]]
    axis.scatter([r["reference_margin"] for r in kept], [max(r["max_abs_diff"], FLOOR) for r in kept], s=8, alpha=0.5, label="same decision", color="#9aa5b1")
    axis.scatter([r["reference_margin"] for r in changed], [max(r["max_abs_diff"], FLOOR) for r in changed], s=22, label="changed decision", color="#c0392b")
    axis.set_yscale("log")
    axis.set_xlabel("reference margin (top-1 minus top-2 probability)")
    axis.set_ylabel("|Δp|")
    axis.set_title("changed decisions against the reference margin")
    axis.legend(loc="best", fontsize=8)
    _gate_line(axis, max_abs_diff)
    figures["changed_vs_margin"] = _png(figure)
    return figures


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}"
    return html.escape(str(value))


def _gates(gates: dict, from_flags: dict) -> str:
    """The gates that applied, each with where it came from (a flag, or the default for the candidate's dtype)."""
    names = {"max_changed_rate": "decisions changed ≤ {:.3g}%", "max_abs_diff": "max |Δp| ≤ {:g}"}
    applied = [
        names[name].format(value * 100 if name == "max_changed_rate" else value) + (" (flag)" if from_flags.get(name) else " (default)")
        for name, value in gates.items() if value is not None and name in names
    ]  # fmt: skip
    return html.escape("; ".join(applied)) if applied else "none (set one with --max-changed-rate or --max-abs-diff)"


def _table(title: str, stats: dict[str, dict]) -> str:
    head = "<tr><th></th><th>count</th><th>median</th><th>p99</th><th>max</th></tr>"
    body = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{s['count']}</td><td>{_fmt(s['median'])}</td><td>{_fmt(s['p99'])}</td><td>{_fmt(s['max'])}</td></tr>"
        for name, s in stats.items()
    )
    return f"<h2>{html.escape(title)}</h2><table>{head}{body}</table>"


def write_report(out: Path, meta: dict, summary: dict, rows: list[dict], failed: list[str]) -> None:
    write_report_file(out / "parity.json", json.dumps({**meta, "summary": summary, "gates_failed": failed, "questions": rows}, indent=1) + "\n")
    gates = meta.get("gates") or {}
    images = plots(rows, gates.get("max_abs_diff"))
    verdict = "<p class='fail'>Gates failed: " + "; ".join(html.escape(f) for f in failed) + "</p>" if failed else "<p class='ok'>All gates passed.</p>"
    overview = (
        f"<table><tr><th>model</th><td>{_fmt(meta['model'])}</td></tr>"
        f"<tr><th>reference / candidate</th><td>{_fmt(meta['against'])} ({_fmt(meta.get('reference_engine'))}) / "
        f"{_fmt(meta['profile'])} ({_fmt(meta.get('candidate_engine'))}, {_fmt(meta.get('candidate_dtype'))})</td></tr>"
        f"<tr><th>gates</th><td>{_gates(gates, meta.get('gates_from_flags') or {})}</td></tr>"
        f"<tr><th>suite</th><td>{_fmt(meta['suite'])}</td></tr>"
        f"<tr><th>questions compared</th><td>{summary['compared']} (of {summary['questions']}; {summary['errors']} answered with errors)</td></tr>"
        f"<tr><th>decisions changed</th><td>{summary['decisions_changed']} ({summary['near_ties_changed']} near-ties, margin &lt; {summary['near_tie_threshold']})</td></tr>"
        f"<tr><th>|Δp| median / p99 / max</th><td>{_fmt(summary['abs_diff']['median'])} / {_fmt(summary['abs_diff']['p99'])} / {_fmt(summary['abs_diff']['max'])}</td></tr></table>"
    )
    figures = "".join(f"<figure><img alt='{name}' src='{src}'><figcaption>{name}</figcaption></figure>" for name, src in images.items())
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>parity: {_fmt(meta['model'])} {_fmt(meta['profile'])} vs {_fmt(meta['against'])}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:60em}}table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}
.ok{{color:#1e7b34}}.fail{{color:#b00020;font-weight:bold}}figure{{display:inline-block;margin:.5em}}img{{max-width:28em}}</style></head>
<body><h1>Parity report</h1>{verdict}{overview}
{_table("|Δp| by question type", summary["abs_diff_by_type"])}
{_table("|Δp| by prompt length (tokens)", summary["abs_diff_by_length"])}
{_table("|Δp| by input kind (text, image, video)", summary.get("abs_diff_by_media", {}))}
<h2>Plots</h2>{figures}
</body></html>
"""
    write_report_file(out / "report.html", page)
