"""Registrars for the subcommands that live in their own modules (heavy imports happen when they run)."""

from runtime.commands import export_cmd

REGISTRARS: list = [export_cmd.register]
