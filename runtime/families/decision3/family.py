"""Decision 3.0 as a family: package, d3 prompt, bare Qwen3.5 text tower (optionally non-causal), code readout."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from transformers.masking_utils import create_recurrent_attention_mask

from vllm_sr_runtime.errors import InvalidRequest, PackageError
from vllm_sr_runtime.families.backbones import build_text_model, read_tensors, text_config_from_dict
from vllm_sr_runtime.families.base import Batch, ExportSpec, Family
from vllm_sr_runtime.families.decision3 import package as pkg
from vllm_sr_runtime.families.decision3.media import DecodedImage, DecodedVideo, MediaLimits, decode_media, pair_timestamps
from vllm_sr_runtime.families.decision3.media_urls import UrlPolicy
from vllm_sr_runtime.families.decision3.prompt import BATCH_SIZE, NUM_CODES, RenderedQuestion, batch_rows, derive_codes, media_rows, render_question
from vllm_sr_runtime.families.decision3.vision import VisionInputs, mrope_positions, prepare
from vllm_sr_runtime.families.decision3.readout import CodeReadout, answer_from_probabilities
from vllm_sr_runtime.families.questions import Question
from vllm_sr_runtime.families.readout_rows import last_layer_at, prunable
from vllm_sr_runtime.families.shared_context import continue_from_prefix, suffix_arrays
from vllm_sr_runtime.families.tokenization import load_qwen2_tokenizer, pad_token_id
from vllm_sr_runtime.families.weights import TensorRef, WeightSource, meta_tensors, parameters_on_meta, tensor_index
from vllm_sr_runtime.numerics import BF16, FP32, Numerics
from vllm_sr_runtime.packages.files import sha256_file
from vllm_sr_runtime.packages.resolve import PackageRef

# Chat templates the d3 prompt renderer reproduces, by SHA-256 (prefixes for the released ones).
KNOWN_CHAT_TEMPLATES = {
    "273d8e0e": "d3-nano / d3-lite",
    "a4aee8af": "d3-flash / d3-mini",
    "c3cf9e34": "d3",
}


class Decision3Module(torch.nn.Module):
    def __init__(
        self, text_model: torch.nn.Module, readout: CodeReadout, noncausal: bool, visual: torch.nn.Module | None = None,
        media_token_ids: tuple[int, int] = (-1, -1),
    ):  # fmt: skip
        super().__init__()
        self.text_model = text_model
        self.readout = readout
        self.noncausal = noncausal
        self.visual = visual  # Qwen3_5VisionModel, for packages with a vision tower
        self.image_token_id, self.video_token_id = media_token_ids
        # ONNX Attention does not broadcast the mask over query positions; Decision3Family.export_module sets this.
        self.full_mask_over_queries = False
        self.readout_rows_only = False  # exported graphs: the last layer at the readout position only (readout_rows)

    def attention_masks(self, embeds: torch.Tensor, attention_mask: torch.Tensor):
        if not self.noncausal:
            return attention_mask
        full = attention_mask.bool()[:, None, None, :]
        if self.full_mask_over_queries:
            full = full.expand(-1, -1, attention_mask.shape[1], -1)
        return {
            # Bidirectional full attention: only pads are masked; always passed so SDPA never goes causal.
            "full_attention": full,
            "linear_attention": create_recurrent_attention_mask(
                config=self.text_model.config, inputs_embeds=embeds, attention_mask=attention_mask
            ),
        }

    def hidden_states(self, input_ids, attention_mask, position_ids):
        """[B, T, hidden]: the final hidden state at every position (the full model, whatever readout_rows_only says)."""
        embeds = self.text_model.embed_tokens(input_ids)
        masks = self.attention_masks(embeds, attention_mask)
        return self.text_model(inputs_embeds=embeds, attention_mask=masks, position_ids=position_ids, use_cache=False).last_hidden_state

    def last_hidden(self, embeds, attention_mask, position_ids):
        """[B, hidden]: the final hidden state at the last position, the one the readout reads."""
        masks = self.attention_masks(embeds, attention_mask)
        with self.last_position_only(embeds) if self.prunes_last_layer else contextlib.nullcontext():
            output = self.text_model(inputs_embeds=embeds, attention_mask=masks, position_ids=position_ids, use_cache=False)
        return output.last_hidden_state[:, -1]

    def last_position_only(self, embeds):
        batch, length = embeds.shape[:2]
        return last_layer_at(self.text_model, torch.arange(length - 1, length, device=embeds.device).expand(batch, 1))

    @property
    def prunes_last_layer(self) -> bool:
        """Whether the last layer computes the readout's row alone (exported graphs; readout_rows)."""
        return self.readout_rows_only and prunable(self.text_model)

    def forward(self, input_ids, attention_mask, position_ids, option_mask):
        return self.readout(self.last_hidden(self.text_model.embed_tokens(input_ids), attention_mask, position_ids), option_mask)

    def forward_media(
        self, input_ids, attention_mask, position_ids, option_mask,
        pixel_values=None, image_grid_thw=None, pixel_values_videos=None, video_grid_thw=None,
    ):  # fmt: skip
        """Rows of one request that reads images/videos: the vision tower runs once per request (images, then
        videos, as transformers' Qwen3_5Model does) and its features fill every row's placeholders."""
        return self.forward_features(
            input_ids, attention_mask, position_ids, option_mask,
            self.visual_features(pixel_values, image_grid_thw), self.visual_features(pixel_values_videos, video_grid_thw),
        )  # fmt: skip

    def visual_features(self, pixels, grid):
        if pixels is None:
            return self.text_model.embed_tokens.weight.new_zeros((0, self.text_model.config.hidden_size))
        return self.visual(pixels.to(next(self.visual.parameters()).dtype), grid_thw=grid).pooler_output

    def forward_features(self, input_ids, attention_mask, position_ids, option_mask, image_features, video_features):
        """The text tower over token embeddings whose image/video placeholders hold the vision tower's features;
        3-D (mrope) positions [3, rows, tokens]. The media text graph is traced from this."""
        embeds = self.text_model.embed_tokens(input_ids)
        embeds = place_features(embeds, input_ids == self.image_token_id, image_features)
        embeds = place_features(embeds, input_ids == self.video_token_id, video_features)
        return self.readout(self.last_hidden(embeds, attention_mask, position_ids), option_mask)

    def forward_shared(self, prefix_ids, input_ids, attention_mask, query_index, option_mask):
        """Profile shared_context: the state prefix is encoded once (bidirectionally among its own tokens when
        non-causal) and every question's suffix attends to it; readout at each row's last real token."""
        embed = self.text_model.embed_tokens
        selected = query_index.view(-1, 1) if self.prunes_last_layer else None
        hidden = continue_from_prefix(self.text_model, embed(prefix_ids), embed(input_ids), attention_mask, causal=not self.noncausal, selected=selected)
        last = hidden[:, 0] if selected is not None else hidden[torch.arange(hidden.shape[0], device=hidden.device), query_index]
        return self.readout(last, option_mask)


def place_features(embeds: torch.Tensor, placeholders: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Every row's k-th placeholder takes features[k] (all rows of a request hold the same placeholders in the
    same order). A gather by per-row running count, not masked_scatter: it traces to plain ONNX ops, and a
    leading zero row lets requests without this modality pass an empty feature table."""
    index = torch.cumsum(placeholders.long(), dim=1) * placeholders
    table = torch.cat([features.new_zeros((1, features.shape[-1])), features]).to(embeds.dtype)
    return torch.where(placeholders.unsqueeze(-1), table[index], embeds)


class Decision3Family(Family):
    name = "decision3"
    input_names = ("input_ids", "attention_mask", "position_ids", "option_mask")
    shared_input_names = ("prefix_ids", "input_ids", "attention_mask", "query_index", "option_mask")
    output_name = "probabilities"
    padding_side = "left"  # the readout reads the last position
    dynamic_axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "option_mask": {0: "batch"},
    }
    # The media text graph (Decision3Module.forward_features): placeholders filled by the vision graph's features.
    media_input_names = ("input_ids", "attention_mask", "position_ids", "option_mask", "image_features", "video_features")
    media_dynamic_axes = {
        **{name: axes for name, axes in dynamic_axes.items() if name != "position_ids"},
        "position_ids": {1: "batch", 2: "sequence"},
        "image_features": {0: "image_tokens"},
        "video_features": {0: "video_tokens"},
    }
    media_modalities = (("pixel_values", "image_grid_thw", "image_features"), ("pixel_values_videos", "video_grid_thw", "video_features"))
    numerics_policy = {"cpu": FP32, "gpu": BF16}
    # The vision tower stays FP32 under --dtype int8 (its graph is written in FP32), so it is not a quantized tower:
    # the measured int8 choice calibrates on text and measures only what the int8 graphs quantize.
    export_spec = ExportSpec(quantized_towers=("text_model.",), embedding_tables=("text_model.embed_tokens.weight",))

    def __init__(self, ref: PackageRef, package: pkg.Decision3Package):
        super().__init__(ref, package)
        root = package.root
        self.tokenizer = load_qwen2_tokenizer(root)
        self.pad_id = pad_token_id(root, self.tokenizer)
        codes, token_ids = derive_codes(self.tokenizer)
        if codes != package.decision_config["codes"] or token_ids != package.decision_config["token_ids"]:
            raise PackageError("codes / token_ids differ from the ones the tokenizer yields", "decision_config.json")
        self.codes = codes
        self.media_limits = MediaLimits()
        self.url_policy = UrlPolicy()  # http(s) media URLs: off unless the server allows hosts
        self._check_chat_template(root)
        self._check_special_ids()

    def _check_chat_template(self, root: Path) -> None:
        template = root / "chat_template.jinja"
        if not template.is_file():
            raise PackageError("required file is missing", "chat_template.jinja")
        digest = sha256_file(template)
        synthetic = self.package.decision_config.get("base_model", "").startswith("synthetic/")
        if not synthetic and digest[:8] not in KNOWN_CHAT_TEMPLATES:
            raise PackageError(f"unknown chat template (sha256 {digest[:12]}…): the d3 renderer cannot vouch for it", "chat_template.jinja")

    def _check_special_ids(self) -> None:
        config = self.package.config
        for key, token in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        ):
            if key in config and self.tokenizer.token_to_id(token) != config[key]:
                raise PackageError(f"{key} {config[key]} is not the tokenizer's id of {token}", "config.json")

    @classmethod
    def detect(cls, root: Path) -> bool:
        return pkg.detect(root)

    @classmethod
    def open(cls, ref: PackageRef, **_: Any) -> "Decision3Family":
        return cls(ref, pkg.verify(ref.path))

    @property
    def parameter_count(self) -> int | None:
        return self.package.parameters.get("loaded") or None

    @property
    def max_input_tokens(self) -> int:
        return self.package.max_input_tokens

    @property
    def reads_media(self) -> bool:
        return self.package.has_vision

    @property
    def noncausal(self) -> bool:
        return self.package.attention_mode == "noncausal_full_attention"

    @property
    def causal_attention(self) -> bool:
        return not self.noncausal

    def backbone_config(self):
        return text_config_from_dict("qwen3_5_text", self.package.config["text_config"])

    def export_module(self, numerics: Numerics, *, weights: bool = True, readout_rows_only: bool = False) -> torch.nn.Module:
        module = super().export_module(numerics, weights=weights, readout_rows_only=readout_rows_only)
        module.full_mask_over_queries = True  # ONNX Attention does not broadcast the mask over query positions
        return module

    def allow_media_urls(self, hosts: tuple[str, ...], allow_private: bool, timeout_s: float) -> None:
        self.url_policy = UrlPolicy(tuple(hosts), allow_private, timeout_s)

    def _weight_index(self, prefix: str) -> dict[str, TensorRef]:
        package = self.package
        return tensor_index([package.root / rel for rel in package.weight_files], prefix, package.root)

    def build_text_model(self, dtype: torch.dtype, weights: bool = True) -> torch.nn.Module:
        package = self.package
        if weights:
            tensors = read_tensors([package.root / rel for rel in package.weight_files], package.text_prefix, package.root)
        else:
            tensors = meta_tensors(self._weight_index(package.text_prefix))
        return build_text_model("qwen3_5_text", self.backbone_config(), tensors, dtype, package.weight_files[0])

    def build_readout(self) -> CodeReadout:
        weight = load_file(str(self.package.root / "readout.safetensors"))["weight"]
        return CodeReadout(weight, self.package.temperature)

    def build_vision_model(self, dtype: torch.dtype, weights: bool = True) -> torch.nn.Module | None:
        package = self.package
        if not package.has_vision:
            return None
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

        config = Qwen3_5VisionConfig(**package.config["vision_config"])
        if weights:
            tensors = read_tensors([package.root / rel for rel in package.weight_files], package.vision_prefix, package.root)
            model = Qwen3_5VisionModel(config)
        else:
            tensors = meta_tensors(self._weight_index(package.vision_prefix))
            with parameters_on_meta():
                model = Qwen3_5VisionModel(config)
        try:
            model.load_state_dict(tensors, strict=True, assign=not weights)
        except RuntimeError as exc:
            raise PackageError(f"vision weights do not fit vision_config: {str(exc)[:300]}", package.weight_files[0]) from None
        return model.to(dtype).eval()

    def build_module(self, numerics: Numerics, device: torch.device, *, weights: bool = True) -> torch.nn.Module:
        config = self.package.config
        module = Decision3Module(
            self.build_text_model(numerics.parameter_dtype, weights), self.build_readout(), self.noncausal,
            visual=self.build_vision_model(numerics.parameter_dtype, weights),
            media_token_ids=(config.get("image_token_id", -1), config.get("video_token_id", -1)),
        )  # fmt: skip
        loaded = sum(p.numel() for p in module.text_model.parameters()) + module.readout.weight.numel()
        expected = self.package.parameters["text"] + self.package.parameters["readout"]
        if module.visual is not None:
            loaded += sum(p.numel() for p in module.visual.parameters())
            expected += self.package.parameters["vision"]
        if loaded != expected:
            raise PackageError(f"loaded {loaded} parameters, the manifest says {expected}", "MODEL_MANIFEST.json")
        return module.to(device).eval() if weights else module.eval()

    def weight_sources(self, numerics: Numerics) -> dict[str, WeightSource]:
        package = self.package
        towers = [("text_model.", package.text_prefix)] + ([("visual.", package.vision_prefix)] if package.has_vision else [])
        return {
            name + key: WeightSource(ref, numerics.parameter_dtype)
            for name, prefix in towers
            for key, ref in self._weight_index(prefix).items()
        }

    def render(self, state: Any, question: Question) -> RenderedQuestion:
        return render_question(state, question, self.tokenizer, self.codes, self.max_input_tokens)

    def batches(self, rendered: list[RenderedQuestion]) -> list[Batch]:
        groups = [rendered[start : start + BATCH_SIZE] for start in range(0, len(rendered), BATCH_SIZE)]
        return [Batch(inputs=self.rows(group), items=group) for group in groups]

    def rows(self, group: list[RenderedQuestion]) -> dict[str, np.ndarray]:
        return batch_rows(group, self.pad_id)

    # -- images and videos -----------------------------------------------------------------------------
    def prepare_media(self, images: Any, videos: Any) -> VisionInputs | None:
        if not images and not videos:
            return super().prepare_media(images, videos)
        if not self.package.has_vision:
            raise InvalidRequest(f"model {self.model_name} has no vision tower; it does not accept images or videos")
        decoded_images, decoded_videos = decode_media(images, videos, self.media_limits, self.url_policy)
        processor = self.package.processor_config
        return prepare(decoded_images, decoded_videos, processor["image_mean"], processor["image_std"])

    def render_media(self, state: Any, question: Question, media: VisionInputs) -> RenderedQuestion:
        return render_question(state, question, self.tokenizer, self.codes, self.max_input_tokens, media_prefix=media.prefix_text)

    def media_batches(self, rendered: list[RenderedQuestion], media: VisionInputs) -> list[Batch]:
        config = self.package.config
        positions = [
            mrope_positions(item.token_ids, config["image_token_id"], config["video_token_id"], media.image_grid_thw, media.video_grid_thw)
            for item in rendered
        ]
        batches = []
        for start in range(0, len(rendered), BATCH_SIZE):
            inputs = media_rows(rendered[start : start + BATCH_SIZE], self.pad_id, positions[start : start + BATCH_SIZE])
            for name in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
                if getattr(media, name) is not None:
                    inputs[name] = getattr(media, name)
            batches.append(Batch(inputs=inputs, items=rendered[start : start + BATCH_SIZE], media=True))
        return batches

    def sample_media(self, videos: bool = True) -> VisionInputs:
        """Two images of different sizes and a 4-frame video, random but fixed: export traces and smoke parity."""
        rng = np.random.default_rng(0)
        images = [DecodedImage(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), h, w) for h, w in ((64, 96), (64, 64))]
        indices = [0, 1, 2, 3]
        video = DecodedVideo(rng.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8), 64, 64, 2.0, indices, pair_timestamps(indices, 2.0))
        processor = self.package.processor_config
        return prepare(images, [video] if videos else [], processor["image_mean"], processor["image_std"])

    def share_limit(self, item: RenderedQuestion) -> int:
        return len(item.token_ids) - 1  # the readout token stays in the suffix

    def shared_rows(self, prefix_length: int, items: list[RenderedQuestion]) -> dict[str, np.ndarray]:
        prefix_ids, input_ids, attention_mask, query_index = suffix_arrays(items, prefix_length, self.pad_id)
        option_mask = np.zeros((len(items), NUM_CODES), dtype=bool)
        for row, item in enumerate(items):
            option_mask[row, : len(item.question.options)] = True
        return {"prefix_ids": prefix_ids, "input_ids": input_ids, "attention_mask": attention_mask, "query_index": query_index, "option_mask": option_mask}

    def answer(self, item: RenderedQuestion, output_row: np.ndarray) -> dict:
        return answer_from_probabilities(item.question, output_row.astype(np.float64).tolist())

    def card(self) -> dict:
        card = super().card()
        card.update(
            {
                "repo": self.package.repo_id,
                "attention_mode": self.package.attention_mode,
                "parameters": self.parameter_count,
                "question_types": ["choice", "noul", "score"],
                "modalities": ["text", "image", "video"] if self.reads_media else ["text"],
            }
        )
        if self.reads_media:
            card["media_limits"] = {**self.media_limits.card(), **self.url_policy.card()}
        return card
