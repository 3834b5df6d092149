"""`export --dtype int8 --int8-embedding int8`: the token embedding table as int8 rows with one scale each, in every
graph that reads it, at a quarter of its bytes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from vllm_sr_runtime.artifact_summary import weight_bytes_by_type
from vllm_sr_runtime.cli import main
from vllm_sr_runtime.cpu_features import widest_int8_weight_bits
from vllm_sr_runtime.export.exporter import export_package
from vllm_sr_runtime.export.int8 import quantize_per_channel

TABLE = "text_model.embed_tokens.weight"


def initializers(path) -> dict[str, np.ndarray]:
    return {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in onnx.load(str(path)).graph.initializer}


def test_the_table_is_stored_as_int8_rows_that_every_graph_reads_from_the_main_file(packages, default_artifact, tmp_path):
    common = {"dtype": "int8", "int8_fp32": "rule", "progress": False, "int8_weight_bits": widest_int8_weight_bits()}
    plain = export_package(packages["d3"], tmp_path / "plain", smoke="off", **common)
    rows = export_package(packages["d3"], tmp_path / "rows", int8_embedding="int8", shared_context=True, **common)  # smoke-gated
    assert plain["int8"]["embedding"] == {"form": "fp32", "tables": []}
    assert rows["int8"]["embedding"] == {"form": "int8 rows", "tables": [TABLE]}
    assert rows["smoke_parity"]["decisions_changed"] == 0 and rows["shared_context"]["smoke_parity"] is not None
    table = initializers(default_artifact("d3") / "model.onnx")[TABLE]  # the package's table, as the fp32 export wrote it
    written = initializers(tmp_path / "rows" / "model.onnx")
    assert TABLE not in written
    expected, scales = quantize_per_channel(table, 0)  # one scale per row, 8 bits whatever the host's products take
    assert np.array_equal(written[f"{TABLE}_quantized_rows"], expected) and written[f"{TABLE}_quantized_rows"].dtype == np.int8
    np.testing.assert_array_equal(written[f"{TABLE}_row_scales"], scales.reshape(-1, 1))
    assert np.abs(written[f"{TABLE}_quantized_rows"] * written[f"{TABLE}_row_scales"] - table).max() <= scales.max() / 2 * 1.001
    # a quarter of the table's bytes, and the shared_context graph reads the main graph's copy
    before, after = weight_bytes_by_type(tmp_path / "plain" / "model.onnx").all, weight_bytes_by_type(tmp_path / "rows" / "model.onnx").all
    assert before["FLOAT"] - after["FLOAT"] == table.nbytes - scales.nbytes and after["INT8"] - before["INT8"] == table.size
    shared = onnx.load(str(tmp_path / "rows" / "model_shared.onnx"), load_external_data=False)
    read = {tensor.name: {e.key: e.value for e in tensor.external_data}.get("location") for tensor in shared.graph.initializer}
    assert read[f"{TABLE}_quantized_rows"] == "model.onnx.data" and TABLE not in read


def test_the_option_is_refused_with_another_dtype(packages, tmp_path, capsys):
    assert main(["export", str(packages["d3"]), "--out", str(tmp_path / "out"), "--int8-embedding", "int8"]) == 2
    assert "--int8-embedding: for --dtype int8 only" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--int8-embedding must be one of fp32, int8"):
        export_package(packages["d3"], tmp_path / "out", dtype="int8", int8_embedding="int4", progress=False)
