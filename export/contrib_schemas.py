"""Registers ONNX op schemas for the com.microsoft ops we emit, copied from ONNX Runtime's own registry.

onnxscript needs a schema to build a node; ONNX Runtime knows the contrib schemas but the onnx package
does not. Copying them (inputs, outputs, attributes) keeps the two in step with the installed ORT.
"""

from __future__ import annotations

import onnx
from onnx.defs import OpSchema

EMITTED_OPS = ("CausalConvWithState", "LinearAttention")
_registered = False

_OPTION = {
    "FormalParameterOption.Single": OpSchema.FormalParameterOption.Single,
    "FormalParameterOption.Optional": OpSchema.FormalParameterOption.Optional,
    "FormalParameterOption.Variadic": OpSchema.FormalParameterOption.Variadic,
}
_ATTR = {
    "AttrType.INT": OpSchema.AttrType.INT,
    "AttrType.FLOAT": OpSchema.AttrType.FLOAT,
    "AttrType.STRING": OpSchema.AttrType.STRING,
    "AttrType.INTS": OpSchema.AttrType.INTS,
    "AttrType.FLOATS": OpSchema.AttrType.FLOATS,
}


def register_contrib_schemas() -> None:
    global _registered
    if _registered:
        return
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    found = {s.name: s for s in ort_state.get_all_operator_schema() if s.domain == "com.microsoft" and s.name in EMITTED_OPS}
    missing = set(EMITTED_OPS) - set(found)
    if missing:
        raise RuntimeError(f"onnxruntime lacks the contrib ops {sorted(missing)}: install onnxruntime>=1.32")
    for name in EMITTED_OPS:
        if onnx.defs.has(name, "com.microsoft"):
            continue
        source = found[name]
        schema = OpSchema(
            name,
            "com.microsoft",
            source.since_version,
            doc=source.doc,
            inputs=[OpSchema.FormalParameter(p.name, p.typeStr, param_option=_OPTION[str(p.option)]) for p in source.inputs],
            outputs=[OpSchema.FormalParameter(p.name, p.typeStr, param_option=_OPTION[str(p.option)]) for p in source.outputs],
            type_constraints=[(c.type_param_str, list(c.allowed_type_strs), "") for c in source.type_constraints],
            attributes=[
                OpSchema.Attribute(attr, _ATTR[str(value.type)], value.description or "", required=False)
                for attr, value in source.attributes.items()
            ],
        )
        onnx.defs.register_schema(schema)
    _registered = True
