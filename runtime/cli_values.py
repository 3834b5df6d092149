"""argparse value types that refuse an impossible number while the command line is parsed, before any work."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    value = _number(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {value}")
    return value


def fraction(text: str) -> float:
    value = _number(text, float, "a number")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in 0..1, not {value}")
    return value


def counts(text: str) -> list[int]:
    """A comma list of whole numbers >= 1 ("64,128,512")."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("needs at least one number (a comma list, e.g. 128,512)")
    return values


def _number(text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
