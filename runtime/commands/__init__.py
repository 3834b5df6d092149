"""Registrars for the subcommands that live in their own modules (heavy imports happen when they run). The
commands of `export` and `parity` register through the `vllm_sr_runtime.commands` entry point group, so the
runtime imports neither."""

from vllm_sr_runtime.commands import bench_cmd, devices_cmd, plugins_cmd, serve_cmd

REGISTRARS: list = [serve_cmd.register, bench_cmd.register, plugins_cmd.register, devices_cmd.register]
