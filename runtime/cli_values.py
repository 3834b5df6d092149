"""argparse value types that refuse an impossible number while the command line is parsed, before any work."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Iterable


def ranged(kind: type, low: float, high: float = math.inf, *, above: bool = False) -> Callable[[str], int | float]:
    """A value type: a `kind` in [low, high] (`above`: strictly more than `low`)."""
    what = "a whole number" if kind is int else "a number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if not ((value > low if above else value >= low) and value <= high):  # NaN fails both
            bound = f"in {low}..{high}" if high != math.inf else f"{'>' if above else '>='} {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, not {value}")
        return value

    return parse


positive_int = ranged(int, 1)
non_negative_int = ranged(int, 0)
port = ranged(int, 0, 65535)
positive_float = ranged(float, 0, above=True)
non_negative_float = ranged(float, 0)
fraction = ranged(float, 0, 1)


def close_call_margin(text: str) -> float | str:
    """--close-call-margin: a number in (0, 1], or "artifact" (the margin the artifact's int8 export measured;
    the same word as close_calls.RECORDED, spelled here so that parsing imports nothing heavy)."""
    if text.strip().lower() == "artifact":
        return "artifact"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1] or 'artifact' (the margin the int8 artifact's export measured), not {text!r}")
    return value


def counts(text: str) -> list[int]:
    """A comma list of whole numbers >= 1 ("64,128,512")."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("needs at least one number (a comma list, e.g. 128,512)")
    return values


def choice_list(allowed: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A value type: a comma list of `allowed` names ("exact,max_speed"), at least one, each once."""
    allowed = list(allowed)

    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"needs at least one {what} (a comma list of {', '.join(allowed)})")
        unknown = [name for name in names if name not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(unknown)} (one of {', '.join(allowed)})")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"a {what} is named twice in {text!r}")
        return names

    return parse
