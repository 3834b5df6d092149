"""Registrars for the subcommands that live in their own modules (heavy imports happen when they run)."""

from vllm_sr_runtime.commands import bench_cmd, export_cmd, parity_cmd, plugins_cmd, selftest_cmd, serve_cmd

REGISTRARS: list = [serve_cmd.register, export_cmd.register, parity_cmd.register, bench_cmd.register, selftest_cmd.register, plugins_cmd.register]
