"""`vllm-sr-runtime selftest [--device auto|cpu|cuda[:N]|rocm[:N]] [--out DIR]`: validate this host end to end."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_sr_runtime.cli_options import add_quiet_option
from vllm_sr_runtime.cli_values import choice_list, counts, positive_float, positive_int


def run(args: argparse.Namespace) -> int:
    from vllm_sr_runtime.parity.selftest import SelftestOptions, print_report, run_selftest

    options = SelftestOptions(
        device=args.device,
        out=Path(args.out),
        fixtures=args.fixtures,
        dtypes=args.dtypes,
        real_dimension=args.real_dimension,
        lengths=args.lengths,
        clients=args.clients,
        http_seconds=args.http_seconds,
        questions=args.questions,
        repeats=args.repeats,
        progress=not args.quiet,
    )
    report = run_selftest(options)
    print_report(report)
    return 1 if report["failed"] else 0


def register(sub) -> None:
    from vllm_sr_runtime.export.export_options import SUPPORTED_DTYPES
    from vllm_sr_runtime.parity.selftest import FIXTURES

    parser = sub.add_parser("selftest", help="validate this host: devices, parity per dtype, latency, serve throughput")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] | rocm[:N]")
    parser.add_argument("--out", default="selftest", help="where fixtures, artifacts and selftest.json go")
    parser.add_argument("--fixtures", type=choice_list(FIXTURES, "fixture"), default=",".join(FIXTURES), help=f"tiny fixtures to check (default all: {','.join(FIXTURES)})")
    parser.add_argument("--dtypes", type=choice_list(SUPPORTED_DTYPES, "dtype"), help="artifact dtypes (default: every dtype the device's provider runs)")
    parser.add_argument(
        "--real-dimension", action=argparse.BooleanOptionalAction, default=None,
        help="also a real-dimension Decision 3.0 nano fixture, measured for latency and serving (default: on a GPU)",
    )  # fmt: skip
    parser.add_argument("--lengths", type=counts, default="128,512,2048", help="forward latency at these prompt lengths (tokens)")
    parser.add_argument("--clients", type=counts, default="1,8,64", help="serve throughput at these client counts")
    parser.add_argument("--http-seconds", type=positive_float, default=10.0, help="seconds per client count")
    parser.add_argument("--questions", type=positive_int, default=40, help="parity questions per fixture and dtype")
    parser.add_argument("--repeats", type=positive_int, default=3, help="forward runs per length and profile")
    add_quiet_option(parser)
    parser.set_defaults(func=run)
