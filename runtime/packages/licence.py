"""Licence policy: a package whose licence (or one of its components') allows only non-commercial or research use
is refused unless the operator accepts that licence by its SPDX id (`--accept-licence ID`, `load(...,
accept_licences=[ID])`). A package that states no licence (a local folder of a plugin family) is not judged."""

from __future__ import annotations

import re
from collections.abc import Iterable

from vllm_sr_runtime.errors import LicenceRefused, PackageError

# SPDX ids (and the Hub's licence names) that limit use to non-commercial or research purposes: the Creative
# Commons NC variants by their "-NC" part, any id that says so in words, and the named research licences.
RESTRICTED_WORDS = re.compile(r"(^|[-_.])NC([-_.]|$)|non-?commercial|research|academic", re.IGNORECASE)
RESTRICTED_NAMES = frozenset({"apple-amlr", "qwen-research", "deepfloyd-if-license", "bigscience-bloom-rail-1.0-nc"})
OPERATORS = {"AND", "OR", "WITH"}


def is_restricted(licence_id: str) -> bool:
    return bool(RESTRICTED_WORDS.search(licence_id)) or licence_id.lower() in RESTRICTED_NAMES


def needed_acceptances(expression: str, accepted: frozenset[str]) -> frozenset[str]:
    """The restricted licence ids (as `expression` spells them) that using `expression` still needs accepted: an AND
    needs every part, an OR the alternative that needs the fewest (an OR with one unrestricted alternative needs
    nothing). `accepted` holds lower-case ids. Raises ValueError on an expression that does not parse."""
    return unaccepted(restricted_ids(expression, accepted), accepted)


def unaccepted(ids: frozenset[str], accepted: frozenset[str]) -> frozenset[str]:
    return frozenset(identifier for identifier in ids if identifier.lower() not in accepted)


def restricted_ids(expression: str, accepted: frozenset[str]) -> frozenset[str]:
    """The restricted licence ids (accepted or not) of the terms using `expression` rests on: every part of an AND,
    and of an OR the alternative that needs the fewest acceptances beyond `accepted` (then the fewest restricted
    ids). Raises ValueError on an expression that does not parse."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expression)
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        if position >= len(tokens):
            raise ValueError(f"licence expression {expression!r} ends early")
        position += 1
        return tokens[position - 1]

    def alternatives() -> frozenset[str]:
        options = [conjunction()]
        while (peek() or "").upper() == "OR":
            take()
            options.append(conjunction())
        return min(options, key=lambda ids: (len(unaccepted(ids, accepted)), len(ids)))

    def conjunction() -> frozenset[str]:
        needed = single()
        while (peek() or "").upper() == "AND":
            take()
            needed = needed | single()
        return needed

    def single() -> frozenset[str]:
        token = take()
        if token == "(":
            needed = alternatives()
            if take() != ")":
                raise ValueError(f"licence expression {expression!r}: unbalanced parentheses")
            return needed
        if token == ")" or token.upper() in OPERATORS:
            raise ValueError(f"licence expression {expression!r}: {token!r} where a licence id belongs")
        if (peek() or "").upper() == "WITH":  # an exception only widens what the licence allows
            take()
            take()
        identifier = token.rstrip("+")
        return frozenset({identifier}) if is_restricted(identifier) else frozenset()

    ids = alternatives()
    if position != len(tokens):
        raise ValueError(f"licence expression {expression!r}: unexpected {tokens[position]!r}")
    return ids


def check_licence(licence: object, accept: Iterable[str], subject: str) -> list[str]:
    """Raise LicenceRefused when `licence` (a manifest's `{spdx, components: [{name, spdx}]}`) needs an acceptance
    that `accept` (SPDX ids, any case) does not give; else return the restricted ids its use rests on, which `accept`
    gave (none for an unrestricted licence). A manifest without a licence passes."""
    if licence is None:
        return []
    accepted = frozenset(item.strip().lower() for item in ([accept] if isinstance(accept, str) else accept))
    parts = licence_parts(licence, subject)
    refused: dict[str, set[str]] = {}
    relied_on: set[str] = set()
    for name, expression in parts:
        try:
            ids = restricted_ids(expression, accepted)
        except ValueError as exc:
            raise PackageError(f"its manifest's licence cannot be read: {exc}", subject) from None
        needed = unaccepted(ids, accepted)
        relied_on |= ids - needed
        for identifier in needed:
            refused.setdefault(identifier, set()).add(name)
    if refused:
        said = "; ".join(f"{identifier}: {', '.join(sorted(names))}" for identifier, names in sorted(refused.items()))
        flags = " ".join(f"--accept-licence {identifier}" for identifier in sorted(refused))
        raise LicenceRefused(
            f"its licence allows only non-commercial or research use ({said}); use it only where that use is "
            f"permitted, and say so: {flags} (load(..., accept_licences=[...]))",
            subject,
            sorted(refused),
        )
    return sorted(relied_on)


def licence_parts(licence: object, subject: str) -> list[tuple[str, str]]:
    """(name, SPDX expression) for the package as a whole and for each component."""
    malformed = PackageError("its manifest's licence must be {spdx, components: [{name, spdx}]}", subject)
    if not isinstance(licence, dict) or not isinstance(licence.get("spdx"), str):
        raise malformed
    parts = [("the package", licence["spdx"])]
    components = licence.get("components") or []
    if not isinstance(components, list):
        raise malformed
    for index, component in enumerate(components):
        if not isinstance(component, dict) or not isinstance(component.get("spdx"), str):
            raise malformed
        parts.append((str(component.get("name") or f"component {index}"), component["spdx"]))
    return parts

