"""Command-line options several commands share, spelt and explained once."""

from __future__ import annotations

import argparse


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """Where a package (REPO@REV or a folder) is read from: the cache, whether the Hub may be reached, an adapter's base."""
    parser.add_argument("--cache-dir", help="package and artifact cache (default $VLLM_SR_RUNTIME_CACHE_DIR or ~/.cache/vllm-sr-runtime)")
    parser.add_argument("--offline", action="store_true", help="never reach a hub: a REPO@REV must already be in the cache")
    parser.add_argument("--base-path", help="local copy of an adapter package's pinned base checkpoint (Vega)")


def add_licence_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--accept-licence", action="append", default=[], metavar="ID",
        help="use a package whose licence (or a component's) allows only non-commercial or research use: its SPDX id, "
        "e.g. CC-BY-NC-4.0 (repeatable); such a package is refused without it",
    )  # fmt: skip


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
