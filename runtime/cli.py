"""`vllm-sr-runtime`: serve | export | parity | bench | selftest | fixture | verify | models | plugins | devices."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vllm_sr_runtime.cli_options import add_source_options
from vllm_sr_runtime.cli_values import positive_float, positive_int
from vllm_sr_runtime.errors import ArtifactError, RuntimeServiceError


def cmd_fixture(args: argparse.Namespace) -> int:
    from vllm_sr_runtime.synthetic.writer import write_synthetic_package

    written = write_synthetic_package(
        args.family,
        Path(args.out),
        backbone=args.backbone,
        size=args.size,
        seed=args.seed,
        adapter=args.adapter,
        calibrated=args.calibrated,
        readout_scale=args.readout_scale,
        attention_mode=args.attention_mode,
        vision=args.vision,
        max_length=args.max_length,
        layers=args.layers,
        golden=not args.no_golden,
        licence=args.licence,
    )
    for path in written:
        print(path)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from vllm_sr_runtime.artifacts import ARTIFACT_FILE, read_artifact
    from vllm_sr_runtime.errors import LicenceRefused
    from vllm_sr_runtime.families import open_family
    from vllm_sr_runtime.packages.licence import check_licence
    from vllm_sr_runtime.packages.resolve import resolve_package

    if (Path(args.package) / ARTIFACT_FILE).is_file():  # an exported artifact: its own manifest lists its files
        manifest = read_artifact(Path(args.package))
        source = manifest.get("source", {})
        print(
            f"ok: artifact {args.package}: {manifest.get('variant')} {manifest.get('dtype')} of {source.get('family')} "
            f"{source.get('model_name')} model_sha256={source.get('model_sha256')} files={len(manifest.get('files') or {})} "
            f"verification=artifact ({ARTIFACT_FILE}: every file's size and sha256)"
        )
        for line in artifact_lines(manifest):
            print(line)
        from vllm_sr_runtime.artifact_summary import claim_mismatch, weight_bytes_by_type, weights_line

        sizes = weight_bytes_by_type(Path(args.package) / manifest["model_file"])
        print(weights_line(sizes.all))
        if mismatch := claim_mismatch(manifest.get("dtype"), sizes.matrices):
            raise ArtifactError(f"artifact {args.package} is not what it claims: {mismatch}")
        return 0
    ref = resolve_package(args.package, cache_dir=args.cache_dir, offline=args.offline or None)
    family = open_family(ref, base_path=Path(args.base_path) if args.base_path else None, cache_dir=args.cache_dir, offline=args.offline or None)
    package = family.package
    origin = f"{ref.repo_id}@{ref.revision}" if ref.repo_id else str(ref.path)
    licence = family.licence
    print(
        f"ok: {family.name} {package.model_name} ({origin}) model_sha256={package.model_sha256} "
        f"max_input_tokens={family.max_input_tokens} verification={'pinned' if ref.repo_id else 'local'} "
        f"licence={licence['spdx'] if isinstance(licence, dict) else licence} {eager_weights(family)}"
    )
    try:
        check_licence(licence, (), origin)
    except LicenceRefused as exc:
        print(f"note: serve, bench and parity need {' '.join(f'--accept-licence {needed}' for needed in exc.needs)} to use it")
    return 0


def artifact_lines(manifest: dict) -> list[str]:
    """What `verify` says of an artifact's numerics: its smoke parity and, for int8, the form, the measured choice
    with its close-call margin, and whether this CPU can serve it."""
    from vllm_sr_runtime.artifact_summary import SATURATES_HERE, int8_form_line, measured_int8_lines, saturates_here, smoke_line

    lines = [smoke_line(manifest)]
    if manifest.get("dtype") == "int8" and manifest.get("int8"):
        lines.append(int8_form_line(manifest))
        if manifest["int8"].get("measured"):
            lines += measured_int8_lines(manifest["int8"]["measured"])
        if saturates_here(manifest):
            lines.append(SATURATES_HERE)
    return lines


def eager_weights(family) -> str:
    """What the exact profile's weights take per device class (for --memory-budget), as `parameters=N eager_weights=..`."""
    from vllm_sr_runtime.engines.torch import parameter_bytes
    from vllm_sr_runtime.weight_budget import size

    count = family.parameter_count
    if count is None:
        return "parameters=unknown"
    sizes = ", ".join(
        f"{device_class} {family.numerics(device_class).label} {size(parameter_bytes(family, device_class))}"
        for device_class in family.numerics_policy
    )
    return f"parameters={count} eager_weights=({sizes})"


def cmd_models(args: argparse.Namespace) -> int:
    from vllm_sr_runtime.packages.releases import RELEASES

    if args.json:
        print(json.dumps([release.to_json() for release in RELEASES], indent=2))
        return 0
    print(f"{'repo':34} {'family':10} {'revision':42} {'pin':20} {'backbone':18} {'parameters':>15}")
    for release in RELEASES:
        params = f"{release.loaded_parameters:,}" if release.loaded_parameters else "-"
        for pinned in release.revisions:
            revision = pinned.revision if pinned.is_full else f"{pinned.revision}… (prefix)"
            pin = pinned.source + (", default" if pinned is release.default else "")
            print(f"{release.repo_id:34} {release.family:10} {revision:42} {pin:20} {release.backbone:18} {params:>15}")
    print("A bare repo id serves its default revision; REPO@REV takes any pinned revision by full commit or a prefix")
    print("of at least 8 hex digits. A prefix is resolved to its full commit (Hub commit listing, or the cache) first.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-sr-runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    fixture = sub.add_parser("fixture", help="write a deterministic synthetic (random-weight) package")
    fixture.add_argument("--family", required=True, choices=["decision2", "decision3"], help="Decision 2.0 (Kai, Eos, Sol, Nox, Lux, Vega) or Decision 3.0")
    fixture.add_argument("--backbone", choices=["qwen3", "qwen3_5"], help="decision2 only (default qwen3_5)")
    fixture.add_argument("--adapter", action="store_true", help="decision2: base checkpoint + LoRA adapter (Vega layout)")
    fixture.add_argument("--size", default="tiny", help="tiny, or real dimensions: lite, nano (decision3); eos, sol, kai (decision2)")
    fixture.add_argument("--seed", type=int, default=0, help="the random weights' seed: the same seed writes the same files")
    fixture.add_argument(
        "--no-golden", action="store_true",
        help="do not record the package's exact answers to the golden suite (golden_answers.json, replayed while serve warms it)",
    )  # fmt: skip
    fixture.add_argument("--calibrated", action="store_true", help="decision2: add score offsets and per-type temperatures")
    fixture.add_argument("--readout-scale", type=positive_float, default=1.0, help="scale the readout so answers are confident (e.g. 8)")
    fixture.add_argument("--attention-mode", choices=["causal", "noncausal_full_attention"], help="decision3 (default noncausal_full_attention, as released)")
    fixture.add_argument("--vision", action="store_true", help="decision3: add a vision tower (visual. weights, processor configs)")
    fixture.add_argument("--max-length", type=int, help="decision3: the longest prompt the package declares (default 4096)")
    fixture.add_argument("--layers", type=positive_int, help="change the backbone's depth (hybrid backbones repeat their size's GDN / full-attention pattern: 3:1 at real dimensions, 1:1 tiny)")
    fixture.add_argument("--licence", default="Apache-2.0", metavar="SPDX", help="the licence the manifest states (e.g. CC-BY-NC-4.0, to try the licence policy)")
    fixture.add_argument("--out", required=True, help="the package folder to write")
    fixture.set_defaults(func=cmd_fixture)

    verify = sub.add_parser("verify", help="verify a package (local dir or REPO@REV), or an exported artifact, without loading it")
    verify.add_argument("package", help="PATH, REPO (a pinned release's default revision) or REPO@REV; or an artifact's folder")
    add_source_options(verify)
    verify.set_defaults(func=cmd_verify)

    models = sub.add_parser("models", help="list the built-in pinned releases, every pinned revision, the default marked")
    models.add_argument("--json", action="store_true", help="print the table as JSON")
    models.set_defaults(func=cmd_models)

    for register in _optional_commands():
        register(sub)
    return parser


def _optional_commands():
    """The runtime's own subcommands, then those the installed packages register (export, parity, selftest:
    entry point group vllm_sr_runtime.commands); a command that fails to import is reported, not fatal."""
    from vllm_sr_runtime import commands
    from vllm_sr_runtime.plugins import installed

    registered = installed("command")
    return [*commands.REGISTRARS, *(registered.get(name) for name in registered.names())]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RuntimeServiceError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`vllm-sr-runtime models | head`): stop quietly, as a shell tool would, and keep
        # Python from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
