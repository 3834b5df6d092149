"""Decision 3.0 images and videos, eager: the package's vision tower through transformers' own classes,
checked against transformers' Qwen3_5Model (features, mrope positions, the whole causal forward) and its
Qwen2-VL image processor; through the real server, every bad input is a 4xx."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from PIL import Image

import vllm_sr_runtime
from vllm_sr_runtime.errors import InvalidRequest
from server_harness import Contract, Server
from test_media import data_url, mp4, png, png_header_only
from vllm_sr_runtime.synthetic.media import noise, png_bytes

CONTRACT = Contract()
QUESTIONS = {
    "what": {"type": "choice", "instructions": "What is shown?", "criteria": {"cat": None, "dog": "a dog", "car": None}},
    "red": {"type": "noul", "instructions": "Is it mostly red?"},
}


def noisy_png(width: int, height: int, seed: int = 0) -> bytes:
    return png_bytes(noise(width, height, seed))


IMAGE = data_url("image/png", noisy_png(300, 200))
VIDEO = data_url("video/mp4", mp4(30, fps=10))


@pytest.fixture(scope="module")
def reference(packages):
    from transformers import Qwen3_5Model

    return Qwen3_5Model.from_pretrained(str(packages["d3_vision_causal"]), dtype=torch.float32).eval()


def tensors(inputs: dict) -> dict:
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in inputs.items()}


def test_whole_forward_matches_transformers_qwen3_5_model(packages, reference):
    """Causal fixture: transformers' Qwen3_5Model runs the same ids and pixels end to end (its processor
    hands every row its own copy of the media); our module must give the same readout."""
    model = vllm_sr_runtime.load(packages["d3_vision_causal"])
    plan = model.plan("Describe the media.", QUESTIONS, images=[IMAGE], videos=[VIDEO])
    (batch,) = plan.batches
    inputs = tensors(batch.inputs)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    rows = ids.shape[0]
    config = reference.config
    types = torch.zeros_like(ids)
    types[ids == config.image_token_id] = 1
    types[ids == config.video_token_id] = 2
    image_grid, video_grid = inputs["image_grid_thw"].repeat(rows, 1), inputs["video_grid_thw"].repeat(rows, 1)
    positions, _ = reference.get_rope_index(ids, types, image_grid, video_grid.clone(), mask)
    real = mask.bool()
    assert torch.equal(positions[:, real], inputs["position_ids"][:, real])  # padding-aware mrope
    module = model.engine.module
    with torch.no_grad():
        ours = module.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
        theirs = reference.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output[0]
        assert torch.equal(ours, theirs)  # the vision tower, bit-identical
        hidden = reference(
            input_ids=ids, attention_mask=mask, mm_token_type_ids=types,
            pixel_values=inputs["pixel_values"].repeat(rows, 1), image_grid_thw=image_grid,
            pixel_values_videos=inputs["pixel_values_videos"].repeat(rows, 1), video_grid_thw=video_grid,
        ).last_hidden_state[:, -1]  # fmt: skip
        expected = module.readout(hidden, inputs["option_mask"])
        got = module.forward_media(**inputs)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)


def test_segmented_tower_matches_transformers_tower(packages):
    """The traced vision module runs equal-size attention segments as one batch; reassembled, its output is
    transformers' tower output on images of two sizes and a 3-group video (grids in patches)."""
    from vllm_sr_runtime.export.vision_graph import SegmentedVision
    from vllm_sr_runtime.engines.onnxruntime.vision_segments import VisionLayout, assemble, segment_groups

    visual = vllm_sr_runtime.load(packages["d3_vision"]).engine.module.visual
    grid = np.array([[1, 4, 6], [1, 4, 4], [3, 4, 4], [1, 2, 2]])
    pixels = np.random.default_rng(0).standard_normal((int(grid.prod(1).sum()), 3 * 2 * 16 * 16)).astype(np.float32)
    layout = VisionLayout.of(visual)
    groups = segment_groups(pixels, grid, layout)
    assert [group.segments for group in groups] == [[0], [1, 2, 3, 4], [5]]  # the 4x4 image and the video's groups batch together
    with torch.no_grad():
        expected = visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid)).pooler_output.numpy()
        outputs = [SegmentedVision(visual)(**tensors(group.inputs)).numpy() for group in groups]
    got = assemble(groups, outputs, grid, 4)
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-5


def test_image_patches_match_the_qwen2_vl_processor(packages):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from vllm_sr_runtime.families.decision3.media import decode_image

    model = vllm_sr_runtime.load(packages["d3_vision"])
    (batch,) = model.plan("x", {"red": QUESTIONS["red"]}, images=[IMAGE]).batches
    resized = decode_image(IMAGE)
    processor = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3, do_resize=False)
    expected = processor(images=[Image.fromarray(resized.pixels)], return_tensors="np")
    assert np.array_equal(expected["image_grid_thw"], batch.inputs["image_grid_thw"])
    assert np.abs(expected["pixel_values"] - batch.inputs["pixel_values"]).max() < 1e-6


def test_media_changes_answers_and_counts_visual_tokens(packages):
    model = vllm_sr_runtime.load(packages["d3_vision"])
    text = model.plan("Describe the media.", QUESTIONS)
    with_image = model.plan("Describe the media.", QUESTIONS, images=[IMAGE])
    image_tokens = (224 // 32) * (320 // 32)  # 200 x 300 px -> smart resize 224 x 320
    # every question's prompt holds the image tokens and the <|vision_start|> / <|vision_end|> around them
    assert with_image.input_tokens == text.input_tokens + len(QUESTIONS) * (image_tokens + 2)
    plain, seen = model.ask("Describe the media.", QUESTIONS), model.ask("Describe the media.", QUESTIONS, images=[IMAGE])
    assert plain["what"]["probabilities"] != seen["what"]["probabilities"]
    other = model.ask("Describe the media.", QUESTIONS, images=[data_url("image/png", noisy_png(300, 200, seed=1))])
    assert other["what"]["probabilities"] != seen["what"]["probabilities"]  # the pixels matter
    broken = {**QUESTIONS, "bad": {"type": "noul", "instructions": "see <|image_pad|>"}}
    answers = model.ask("Describe the media.", broken, images=[IMAGE])
    assert answers["bad"]["error"] == "invalid_question" and answers["what"] == seen["what"]


def test_the_vision_tower_runs_once_per_request(packages):
    """Twenty questions are three batches of rows; they share one pass of the tower (the engine keeps the
    features of the request's pixel array) and answer as they would one by one."""
    model = vllm_sr_runtime.load(packages["d3_vision"])
    calls = []
    model.engine.module.visual.register_forward_hook(lambda *_: calls.append(1))
    many = {f"q{i}": QUESTIONS["red"] for i in range(20)}
    answers = model.ask("Describe the media.", many, images=[IMAGE], videos=[VIDEO])
    assert len(calls) == 2  # the images once, the videos once
    alone = model.ask("Describe the media.", {"q19": QUESTIONS["red"]}, images=[IMAGE], videos=[VIDEO])
    assert len(calls) == 4  # a new request decodes new arrays: the tower runs again
    assert abs(alone["q19"]["noul"] - answers["q19"]["noul"]) < 1e-6


def test_processor_config_with_other_patching_is_refused(packages, tmp_path):
    import dataclasses
    import json
    import shutil

    from vllm_sr_runtime.errors import PackageError
    from vllm_sr_runtime.families.decision3.package import verify

    package = verify(packages["d3_vision"])
    assert package.processor_config["image_mean"] == [0.5, 0.5, 0.5]
    shutil.copytree(packages["d3_vision"], tmp_path / "p")
    config = json.loads((tmp_path / "p" / "preprocessor_config.json").read_text())
    (tmp_path / "p" / "preprocessor_config.json").write_text(json.dumps({**config, "patch_size": 14}))
    with pytest.raises(PackageError, match="patch_size 14 is not 16"):
        dataclasses.replace(package, root=tmp_path / "p").processor_config


def test_text_only_models_refuse_media(packages):
    with pytest.raises(InvalidRequest, match="does not accept images"):
        vllm_sr_runtime.load(packages["d3"]).plan("x", QUESTIONS, images=[IMAGE])
    with pytest.raises(InvalidRequest, match="does not accept images"):
        vllm_sr_runtime.load(packages["d2_qwen3_5"]).plan("x", QUESTIONS, videos=[VIDEO])


@pytest.fixture(scope="module")
def server(packages, tmp_path_factory):
    log = tmp_path_factory.mktemp("vision") / "server.log"
    # http(s) media URLs only from the loopback test host (private addresses allowed explicitly).
    started = Server([str(packages["d3_vision"]), "--device", "cpu", "--media-url-allow", "127.0.0.1", "--media-url-allow-private"], log=log)
    try:
        started.wait()
        yield started
    finally:
        started.stop()


def post(server: Server, body: dict):
    reply = server.request("POST", "/v1/systemone", body)
    CONTRACT.check("/v1/systemone", "POST", reply)
    return reply


def test_server_answers_image_and_video_requests(server, packages):
    reply = post(server, {"state": "Describe the media.", "questions": QUESTIONS, "images": [IMAGE], "videos": [VIDEO]})
    assert reply.status == 200, reply.body
    local = vllm_sr_runtime.load(packages["d3_vision"]).respond("Describe the media.", QUESTIONS, [IMAGE], [VIDEO])
    assert reply.json()["usage"]["input_tokens"] == local.input_tokens
    assert reply.json()["answers"]["what"]["choice"] == local.answers["what"]["choice"]
    card = server.request("GET", "/v1/models").json()["data"][0]
    assert card["modalities"] == ["text", "image", "video"] and card["media_limits"]["image_max_bytes"] == 8_000_000
    assert card["media_limits"]["http_urls"] == ["127.0.0.1"]


def test_server_fetches_allowed_media_urls(server):
    from test_media import MediaHost

    host = MediaHost()
    try:
        by_url = post(server, {"state": "x", "questions": QUESTIONS, "images": [f"{host.base}/cat.png"]})
        inline = post(server, {"state": "x", "questions": QUESTIONS, "images": [data_url("image/png", png(300, 200))]})
        assert by_url.status == 200 and by_url.json()["answers"] == inline.json()["answers"]
        redirected = post(server, {"state": "x", "questions": QUESTIONS, "images": [f"{host.base}/moved.png"]})
        assert redirected.status == 400 and "redirects" in redirected.json()["error"]["message"]
    finally:
        host.server.shutdown()


@pytest.mark.parametrize(
    ("media", "status", "message"),
    [
        ({"images": [data_url("image/png", png(64, 64)[:60])]}, 400, "not a valid image/png"),
        ({"images": [data_url("image/jpeg", png(64, 64))]}, 400, "not a valid image/jpeg"),
        ({"images": [data_url("image/png", png_header_only(20_000, 20_000))]}, 413, "decompression bomb"),
        ({"images": ["https://example.com/cat.png"]}, 400, "not on this server's media URL allow-list"),
        ({"images": "data:image/png;base64,AAAA"}, 400, "list"),
        ({"videos": [data_url("video/mp4", mp4(0))]}, 400, "video"),
        ({"videos": [data_url("video/mp4", b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 40)]}, 400, "not a decodable video"),
    ],
)
def test_server_refuses_bad_media_with_4xx(server, media, status, message):
    reply = post(server, {"state": "x", "questions": QUESTIONS, **media})
    assert reply.status == status, reply.body
    assert message in reply.json()["error"]["message"]


def test_parity_suite_reads_media(packages, tmp_path):
    import json
    import subprocess
    import sys

    from vllm_sr_runtime.parity.suite import builtin_suite

    suite = builtin_suite(4096, media=True)
    media = [r for r in suite if r.images or r.videos]
    assert {bool(r.images) for r in media} == {True, False} and any(r.videos for r in media)
    assert [r.images for r in media] == [r.images for r in builtin_suite(4096, media=True) if r.images or r.videos]  # deterministic
    lines = [json.dumps({"id": r.id, "state": r.state, "questions": r.questions, "images": r.images, "videos": r.videos}) for r in media]
    (tmp_path / "media.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "parity"
    result = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "parity", str(packages["d3_vision"]), "--profile", "batching", "--suite", str(tmp_path / "media.jsonl"),
         "--out", str(out), "--quiet", "--max-abs-diff", "1e-5"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "parity.json").read_text())["summary"]
    assert summary["compared"] == sum(len(r.questions) for r in media) and summary["errors"] == 0
    assert set(summary["abs_diff_by_media"]) == {"image", "video", "image+video"}


@pytest.fixture(scope="module")
def vision_artifact(packages, tmp_path_factory):
    from vllm_sr_runtime.export.exporter import export_package

    artifact = tmp_path_factory.mktemp("vision-artifact") / "artifact"
    export_package(packages["d3_vision"], artifact, progress=False)
    return artifact


def test_max_speed_answers_media_like_exact(packages, vision_artifact):
    """The artifact's vision graph (per attention segment) and media text graph against the eager tower:
    images of two sizes, a video, both, and text alone (which stays on the token-id graph)."""
    import json

    artifact = vision_artifact
    manifest = json.loads((artifact / "artifact.json").read_text())
    assert {io["name"] for io in manifest["media"]["vision"]["io"]["inputs"]} == {"pixel_values", "interp_indices", "interp_weights", "position_ids"}
    assert [io["shape"] for io in manifest["media"]["text"]["io"]["inputs"] if io["name"] == "position_ids"] == [[3, "batch", "sequence"]]
    assert manifest["media"]["text"]["weights_from_main"] > 0
    exact = vllm_sr_runtime.load(packages["d3_vision"])
    fast = vllm_sr_runtime.load(packages["d3_vision"], profile="max_speed", artifact=artifact)
    small = data_url("image/png", noisy_png(400, 170, seed=3))
    requests = [([IMAGE], None), (None, [VIDEO]), ([IMAGE, small], [VIDEO]), (None, None)]
    worst = 0.0
    for images, videos in requests:
        expected, got = exact.respond("Describe the media.", QUESTIONS, images, videos), fast.respond("Describe the media.", QUESTIONS, images, videos)
        assert got.input_tokens == expected.input_tokens
        for key, answer in expected.answers.items():
            a = np.array(list(answer["probabilities"].values())) if "probabilities" in answer else np.array([answer["noul"]])
            b = np.array(list(got.answers[key]["probabilities"].values())) if "probabilities" in answer else np.array([got.answers[key]["noul"]])
            worst = max(worst, float(np.abs(a - b).max()))
    assert worst <= 1e-4


def test_artifacts_without_the_vision_graph_refuse_media(packages, vision_artifact, tmp_path):
    import json
    import shutil

    from vllm_sr_runtime.artifacts import write_manifest

    artifact = tmp_path / "artifact"
    shutil.copytree(vision_artifact, artifact)
    manifest = json.loads((artifact / "artifact.json").read_text())
    for graph in ("vision", "text"):
        for file in artifact.glob(manifest["media"][graph]["model_file"] + "*"):
            file.unlink()
    manifest["media"] = None  # as exported before the media graphs existed
    write_manifest(artifact, {key: value for key, value in manifest.items() if key != "files"})
    fast = vllm_sr_runtime.load(packages["d3_vision"], profile="max_speed", artifact=artifact)
    with pytest.raises(InvalidRequest, match="cannot read images"):
        fast.plan("x", QUESTIONS, images=[IMAGE])
    assert fast.ask("x", QUESTIONS)["red"]["type"] == "noul"  # text requests are unaffected


def test_bench_forward_with_media(packages, vision_artifact, tmp_path):
    """bench --media: every request carries the synthetic image and video on both profiles; the prompt
    length counts their visual tokens."""
    import json
    import subprocess
    import sys

    from vllm_sr_runtime.bench.media import IMAGE_SIZE, VIDEO_SIZE

    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "-m", "vllm_sr_runtime.cli", "bench", str(packages["d3_vision"]), "--artifact", str(vision_artifact), "--media", "image+video",
         "--lengths", "100", "--questions", "1", "--repeats", "1", "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert {row["profile"] for row in rows} == {"exact", "max_speed"} and {row["media"] for row in rows} == {"image+video"}
    image_tokens = (IMAGE_SIZE[0] // 32) * (IMAGE_SIZE[1] // 32)
    video_tokens = 4 * (VIDEO_SIZE[0] // 32) * (VIDEO_SIZE[1] // 32)  # 8 frames sampled at 2 fps from 4 s: 4 pairs
    assert all(row["length"] > image_tokens + video_tokens for row in rows)
    assert all(row["median_ms"] > 0 and row["ratio_to_exact"] > 0 for row in rows)


def test_streamed_media_graphs_equal_a_trace_with_weights(packages, vision_artifact):
    """The vision graph and the media text graph are the ones torch.onnx makes from the module with its
    weights (same ops and wiring, every weight byte-identical)."""
    import onnx
    import torch

    from vllm_sr_runtime.export.exporter import build_export_module
    from vllm_sr_runtime.export.graph_emit import translation_table
    from vllm_sr_runtime.export.smoke import SMOKE_QUESTIONS, SMOKE_STATE
    from vllm_sr_runtime.export.vision_graph import VISION_DYNAMIC_AXES, VISION_OUTPUT, SegmentedVision
    from reference_trace import assert_same_graph, reference_trace
    from vllm_sr_runtime.families import open_family
    from vllm_sr_runtime.engines.onnxruntime.vision_segments import SEGMENT_INPUTS, VisionLayout, segment_groups
    from vllm_sr_runtime.packages.resolve import resolve_package

    family = open_family(resolve_package(packages["d3_vision"]))
    module = build_export_module(family, "fp32", readout_rows_only=True)
    media = family.sample_media()
    (sample,) = segment_groups(media.pixel_values_videos, media.video_grid_thw, VisionLayout.of(module.visual))
    reference = reference_trace(SegmentedVision(module.visual).eval(), sample.inputs, SEGMENT_INPUTS, VISION_DYNAMIC_AXES, VISION_OUTPUT, {})
    assert_same_graph(onnx.load(str(vision_artifact / "vision.onnx")), reference)
    batch = family.plan(SMOKE_STATE, SMOKE_QUESTIONS, media=media).batches[0]
    with torch.no_grad():
        features = {
            "image_features": module.visual_features(torch.from_numpy(media.pixel_values), torch.from_numpy(media.image_grid_thw)),
            "video_features": module.visual_features(torch.from_numpy(media.pixel_values_videos), torch.from_numpy(media.video_grid_thw)),
        }
    inputs = {**batch.inputs, **features}
    reference = reference_trace(
        module, inputs, family.media_input_names, family.media_dynamic_axes, family.output_name, translation_table(family.backbone_config()), "forward_features"
    )  # fmt: skip
    assert_same_graph(onnx.load(str(vision_artifact / "model_media.onnx")), reference)


def test_media_graphs_tell_causal_from_noncausal(packages, vision_artifact, tmp_path):
    """With an image, the causal and non-causal readings of the same weights differ far beyond the media
    graphs' tolerance, on eager and on the exported graphs alike."""
    from attention_direction import FAR, TOLERANCE, max_difference
    from vllm_sr_runtime.export.exporter import export_package

    causal_artifact = tmp_path / "causal"
    export_package(packages["d3_vision_causal"], causal_artifact, progress=False, smoke="off")
    eager = {name: vllm_sr_runtime.load(packages[name]) for name in ("d3_vision", "d3_vision_causal")}
    fast = {
        "d3_vision": vllm_sr_runtime.load(packages["d3_vision"], profile="max_speed", artifact=vision_artifact),
        "d3_vision_causal": vllm_sr_runtime.load(packages["d3_vision_causal"], profile="max_speed", artifact=causal_artifact),
    }
    media = {"images": [IMAGE]}
    for name in eager:
        assert max_difference(eager[name], fast[name], **media) <= TOLERANCE
    assert max_difference(eager["d3_vision"], eager["d3_vision_causal"], **media) > FAR
    assert max_difference(fast["d3_vision"], fast["d3_vision_causal"], **media) > FAR


def test_the_default_int8_export_of_a_vision_package_measures_and_quantizes_the_text_tower_only(packages, tmp_path):
    """`export --dtype int8` (the measured choice, its default) on a package with a vision tower: it measures the
    text tower's Linears, on the built-in requests and some of them again with the family's sample media, and the
    finished graphs answer all of them; the vision graph stays FP32 and the media text graph is int8; a request with
    an image answers through the artifact like exact."""
    import json
    from collections import Counter

    import onnx

    from vllm_sr_runtime.export.exporter import export_package

    artifact = tmp_path / "int8"
    export_package(packages["d3_vision"], artifact, dtype="int8", progress=False)
    manifest = json.loads((artifact / "artifact.json").read_text())
    measured = manifest["int8"]["measured"]
    assert manifest["int8"]["fp32_choice"] == "measured" and measured["rows"] > 0
    assert all(name.startswith("text_model.") for name in [*measured["kept"], *measured["blocked"], *measured["split"]])
    assert measured["calibration"]["media_requests"] == 2 and measured["calibration_parity"]["questions"] == measured["calibration"]["questions"]
    assert [phase["name"] for phase in manifest["export"]["phases"]][-3:] == ["media smoke", "calibration parity", "finalize"]  # once the media graph runs
    ops = {graph: Counter(node.op_type for node in onnx.load(str(artifact / manifest["media"][graph]["model_file"]), load_external_data=False).graph.node) for graph in ("vision", "text")}
    assert ops["vision"]["MatMul"] > 0 and not any("Integer" in op or "Quantize" in op for op in ops["vision"])
    assert ops["text"]["MatMulIntegerToFloat"] > 0
    assert all(smoke["decisions_changed_beyond_near_ties"] == 0 for smoke in manifest["media"]["smoke_parity"].values())
    exact = vllm_sr_runtime.load(packages["d3_vision"])
    fast = vllm_sr_runtime.load(packages["d3_vision"], profile="max_speed", artifact=artifact)
    expected, got = exact.respond("Describe the media.", QUESTIONS, [IMAGE], None), fast.respond("Describe the media.", QUESTIONS, [IMAGE], None)
    assert got.input_tokens == expected.input_tokens
    assert abs(got.answers["red"]["noul"] - expected.answers["red"]["noul"]) <= 0.05
    for option, probability in expected.answers["what"]["probabilities"].items():
        assert abs(got.answers["what"]["probabilities"][option] - probability) <= 0.05


def test_int8_calibration_refuses_a_quantized_tower_that_text_does_not_reach(models, monkeypatch):
    """A family that declares its vision tower quantized cannot have it measured on text calibration: the
    measurement names the unreached Linear instead of failing on a missing capture."""
    from vllm_sr_runtime.export import int8_sensitivity
    from vllm_sr_runtime.export.exporter import build_export_module
    from vllm_sr_runtime.families.base import ExportSpec

    family = models("d3_vision").family
    module = build_export_module(family, "fp32")
    monkeypatch.setattr(family, "export_spec", ExportSpec(quantized_towers=("text_model.", "visual.")))
    with pytest.raises(ValueError, match=r"did not run in a calibration question's text pass.*first: visual\."):
        int8_sensitivity.measure(family, module, int8_sensitivity.builtin_calibration().requests)


def test_int8_calibration_measures_requests_with_images_through_the_vision_features(models, tmp_path):
    """`--int8-calibration` requests with images: their rows run the text tower over the vision features (the
    eager answers are exact's with the image, not the text-only ones), and each row is measured."""
    import json

    from vllm_sr_runtime.export import int8_sensitivity
    from vllm_sr_runtime.export.exporter import build_export_module
    from vllm_sr_runtime.families.answers import answer_distribution

    model = models("d3_vision")
    state = "Describe the media."
    path = tmp_path / "traffic.jsonl"
    path.write_text(json.dumps({"id": "t", "state": state, "questions": QUESTIONS}) + "\n" + json.dumps({"id": "m", "state": state, "questions": QUESTIONS, "images": [IMAGE]}) + "\n")
    calibration = int8_sensitivity.calibration_requests(path)
    assert calibration.source["media_requests"] == 1 and calibration.source["questions"] == 2 * len(QUESTIONS)
    int8_sensitivity.check_calibration(model.family, calibration)
    module = build_export_module(model.family, "fp32")
    measured = int8_sensitivity.measure(model.family, module, list(calibration.requests), media_requests=calibration.media)
    text = [answer_distribution(answer) for answer in model.ask(state, QUESTIONS).values()]
    with_image = [answer_distribution(answer) for answer in model.ask(state, QUESTIONS, [IMAGE]).values()]
    assert len(measured.answers) == 2 * len(QUESTIONS)
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(measured.answers, text + with_image))
    assert not np.allclose(text[0], with_image[0], atol=1e-3)  # the image moves the answers this test tells apart
    assert len(measured.margins) == len(measured.variance) > len(QUESTIONS)  # media rows measured, not only answered


def test_calibration_media_is_prepared_one_request_at_a_time(models, monkeypatch):
    """A calibration file of many large images never holds their pixels at once: the measurement and the graph's
    calibration parity each prepare a request's media as they reach it and drop it after."""
    import gc
    import weakref

    from vllm_sr_runtime.export import int8_sensitivity
    from vllm_sr_runtime.export.exporter import build_export_module
    from vllm_sr_runtime.export.smoke import graph_parity

    family = models("d3_vision").family
    prepared: list[weakref.ref] = []
    most = [0]
    prepare = int8_sensitivity.MediaRequest.prepare

    def counted(self, family):
        gc.collect()
        media = prepare(self, family)
        prepared.append(weakref.ref(media))
        most[0] = max(most[0], sum(ref() is not None for ref in prepared))
        return media

    monkeypatch.setattr(int8_sensitivity.MediaRequest, "prepare", counted)
    calibration = int8_sensitivity.Calibration((), {}, tuple(int8_sensitivity.MediaRequest(f"state {n}", QUESTIONS, sample="images") for n in range(4)))
    measured = int8_sensitivity.measure(family, build_export_module(family, "fp32"), [], media_requests=calibration.media)
    assert len(measured.answers) == 4 * len(QUESTIONS) and most[0] <= 2  # the one being measured and, until it is replaced, the one before
    most[0] = 0
    checked = graph_parity(family, models("d3_vision").engine, (), measured.answers, calibration.prepared_media(family))
    assert checked["questions"] == 4 * len(QUESTIONS) and checked["max_abs_diff"] < 1e-5 and most[0] <= 2
