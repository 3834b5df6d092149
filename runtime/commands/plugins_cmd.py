"""`vllm-sr-runtime plugins [--json]`: the installed plugins of every kind, where each comes from, and any that
failed to load."""

from __future__ import annotations

import argparse
import json


def run(args: argparse.Namespace) -> int:
    from vllm_sr_runtime.plugins import GROUPS, installed

    report = {"plugins": [], "failed": []}
    for kind in GROUPS:
        plugins = installed(kind)
        report["plugins"].extend(plugins.descriptor(name).as_dict() for name in plugins.names())
        report["failed"].extend(failure.as_dict() for failure in plugins.failed)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for row in report["plugins"]:
        print(f"{row['kind']:<12} {row['name']:<16} {row['distribution']} {row['version']}  ({row['target']})")
    for row in report["failed"]:
        print(f"{row['kind']:<12} {row['name']:<16} {row['distribution']} {row['version']}  FAILED TO LOAD: {row['error']}")
    return 0


def register(sub) -> None:
    parser = sub.add_parser("plugins", help="list the installed family, engine, accelerator and profile plugins")
    parser.add_argument("--json", action="store_true", help="print as JSON")
    parser.set_defaults(func=run)
