"""`vllm-sr-runtime devices [--json]`: every accelerator plugin, how many devices it sees, the ONNX Runtime
providers it would use (in order of preference, and whether this installation has them), what
`--device auto` picks and why, and which int8 weight bits this CPU's ONNX Runtime products take."""

from __future__ import annotations

import argparse
import json


def report() -> dict:
    from vllm_sr_runtime.cpu_features import int8_products_saturate, widest_int8_weight_bits
    from vllm_sr_runtime.devices import auto_choice
    from vllm_sr_runtime.errors import UnsupportedDeviceError
    from vllm_sr_runtime.plugins import installed

    try:
        import onnxruntime

        available = set(onnxruntime.get_available_providers())
    except ImportError:  # the serve-only install: eager profiles run without ONNX Runtime
        available = set()
    plugins = installed("accelerator")
    rows = []
    for name in plugins.names():
        spec, descriptor = plugins.get(name), plugins.descriptor(name)
        visible = spec.visible()
        rows.append({
            "kind": spec.kind, "distribution": descriptor.distribution, "version": descriptor.version, "visible": visible,
            "why_absent": None if visible else spec.why_absent(), "device_class": spec.device_class, "torch_type": spec.torch_type,
            "providers": [{"name": p.name, "package": p.package, "installed": p.name in available} for p in spec.providers],
            "artifact_dtypes": list(spec.artifact_dtypes), "variant": spec.variant or "contrib",
        })  # fmt: skip
    try:
        device, why = auto_choice(plugins.objects())
        auto = {"device": device.name, "why": why}
    except UnsupportedDeviceError as exc:
        auto = {"device": None, "why": [exc.message]}
    saturates = int8_products_saturate()
    cpu_int8 = {
        "products_saturate": saturates, "int8_weight_bits": widest_int8_weight_bits(saturates),
        "why": "x86-64 without VNNI: ONNX Runtime's u8 x s8 product sums byte pairs in saturating 16 bits" if saturates
        else "ONNX Runtime's int8 products accumulate in 32 bits on this CPU",
    }  # fmt: skip
    return {"auto": auto, "accelerators": rows, "cpu_int8": cpu_int8, "failed": [failure.as_dict() for failure in plugins.failed]}


def run(args: argparse.Namespace) -> int:
    found = report()
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    for row in found["accelerators"]:
        providers = ", ".join(f"{p['name']}{'' if p['installed'] else ' (not installed: pip install ' + p['package'] + ')'}" for p in row["providers"])
        seen = f"{row['visible']} visible" if row["visible"] else f"none ({row['why_absent']})"
        print(f"{row['kind']:<8} {seen:<48} providers: {providers}  [{row['distribution']} {row['version']}]")
    for row in found["failed"]:
        print(f"{row['name']:<8} FAILED TO LOAD ({row['distribution']} {row['version']}): {row['error']}")
    print(f"auto -> {found['auto']['device']}: {'; '.join(found['auto']['why'])}")
    cpu_int8 = found["cpu_int8"]
    print(f"cpu int8 artifacts: --int8-weight-bits {cpu_int8['int8_weight_bits']} ({cpu_int8['why']})")
    return 0


def register(sub) -> None:
    parser = sub.add_parser("devices", help="the accelerators, their ONNX Runtime providers, and what --device auto picks and why")
    parser.add_argument("--json", action="store_true", help="print as JSON")
    parser.set_defaults(func=run)
