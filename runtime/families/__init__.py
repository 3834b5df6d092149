"""Registry of model families: each detects its own package format."""

from __future__ import annotations

from pathlib import Path

from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.families.base import Family
from vllm_sr_runtime.packages.resolve import PackageRef


def registry() -> dict[str, type[Family]]:
    """The installed family plugins (entry point group vllm_sr_runtime.families), built-ins included."""
    from vllm_sr_runtime.plugins import installed

    return installed("family").objects()


def detect_family(root: Path) -> type[Family]:
    families = registry()
    matches = [family for family in families.values() if family.detect(Path(root))]
    if len(matches) != 1:
        found = "no" if not matches else "several"
        raise PackageError(f"{found} installed family's package format matches (families: {', '.join(families)})", str(root))
    return matches[0]


def open_family(ref: PackageRef, **options) -> Family:
    """Detect the package's family, verify and open it; a pinned release must also have its known identity."""
    family = detect_family(ref.path).open(ref, **options)
    if options.get("base_path") is not None and not family.reads_base_checkpoint:
        raise PackageError(f"a base checkpoint ({options['base_path']}) was given, but {family.model_name} is not an adapter package: drop base_path (--base-path)", str(ref.path))
    expected = ref.pinned.model_sha256 if ref.pinned else None
    if expected and not family.package.model_sha256.startswith(expected):
        raise PackageError(
            f"{ref.repo_id}@{ref.revision}: identity model_sha256={family.package.model_sha256} is not the pinned "
            f"release's ({expected}...)",
            str(ref.path),
        )
    return family
