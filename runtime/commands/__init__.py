"""Registrars for the subcommands that live in their own modules (serve, export, parity, bench)."""

REGISTRARS: list = []
