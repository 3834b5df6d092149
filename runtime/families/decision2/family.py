"""Decision 2.0 as a family: package, prompt, backbone (+ unmerged LoRA), candidate head, answers."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.families.backbones import build_text_model, read_tensors, text_config_from_dict
from vllm_sr_runtime.families.base import Batch, ExportSpec, Family
from vllm_sr_runtime.families.decision2 import package as pkg
from vllm_sr_runtime.families.decision2.prompt import ROW_MULTIPLE, RenderedQuestion, batch_rows, render_question
from vllm_sr_runtime.families.decision2.readout import CandidateHead, answer_from_logits
from vllm_sr_runtime.families.questions import Question
from vllm_sr_runtime.families.readout_rows import last_layer_at, prunable
from vllm_sr_runtime.families.shared_context import continue_from_prefix, suffix_arrays
from vllm_sr_runtime.families.tokenization import load_plain_tokenizer, pad_token_id
from vllm_sr_runtime.families.weights import LoraDelta, WeightSource, meta_tensors, tensor_index
from vllm_sr_runtime.numerics import BF16_AUTOCAST, FP32, Numerics
from vllm_sr_runtime.packages.files import read_json
from vllm_sr_runtime.packages.resolve import PackageRef, resolve_package

# Rows of one forward pass are split only above this many padded tokens (FLA's 2^30-element q/k/v limit
# is far above anything a CPU runs; this bounds activation memory instead).
FORWARD_TOKEN_BUDGET = 1 << 20
BASE_PREFIX = "model.language_model."


class Decision2Module(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, head: CandidateHead, autocast_dtype: torch.dtype | None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.autocast_dtype = autocast_dtype
        self.readout_rows_only = False  # exported graphs: the last layer at the head's positions only (readout_rows)

    def _autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()  # no autocast (also on the meta device an export traces on)
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def _fp32(self, device: torch.device):
        """The head runs in FP32 whatever autocast is around it (meta, the device of a trace, has no autocast)."""
        if not torch.amp.is_autocast_available(device.type):
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, enabled=False)

    def forward(self, input_ids, attention_mask, position_ids, option_index, option_mask, query_index):
        rows = self.head_rows(option_index, query_index)
        with self._autocast(input_ids.device), rows.computed_only(self.backbone):
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        option_rows, query_row = rows.indices(option_index, query_index)
        with self._fp32(input_ids.device):
            return self.head(hidden, option_rows, option_mask, query_row)

    def forward_shared(self, prefix_ids, input_ids, attention_mask, option_index, option_mask, query_index):
        """Profile shared_context: suffix rows continue one prefix (causal, so the rows' hidden states are
        the full rows' ones); option and query indices are relative to the suffix."""
        embed = self.backbone.get_input_embeddings()
        rows = self.head_rows(option_index, query_index)
        with self._autocast(input_ids.device):
            hidden = continue_from_prefix(self.backbone, embed(prefix_ids), embed(input_ids), attention_mask, causal=True, selected=rows.positions)
        option_rows, query_row = rows.indices(option_index, query_index)
        with self._fp32(input_ids.device):
            return self.head(hidden, option_rows, option_mask, query_row)

    @property
    def prunes_last_layer(self) -> bool:
        """Whether the last layer computes the head's rows alone (exported graphs; readout_rows)."""
        return self.readout_rows_only and prunable(self.backbone)

    def head_rows(self, option_index, query_index) -> "HeadRows":
        return HeadRows.of(option_index, query_index) if self.prunes_last_layer else HeadRows(None)


class HeadRows:
    """The rows the candidate head reads: every option's endpoint, then the query token. With `positions` (exported
    graphs) the last layer computes only those and the head reads them in that order; without, the full model."""

    def __init__(self, positions: torch.Tensor | None):
        self.positions = positions

    @classmethod
    def of(cls, option_index: torch.Tensor, query_index: torch.Tensor) -> "HeadRows":
        return cls(torch.cat([option_index, query_index.view(-1, 1)], dim=1))

    @staticmethod
    def count(option_count: int) -> int:
        """How many rows `of` selects (what bench counts the last layer at)."""
        return option_count + 1

    def computed_only(self, backbone: torch.nn.Module):
        return contextlib.nullcontext() if self.positions is None else last_layer_at(backbone, self.positions)

    def indices(self, option_index, query_index):
        """(option index, query index) into the hidden states the backbone returned."""
        if self.positions is None:
            return option_index, query_index
        options = option_index.shape[1]
        return torch.arange(options, device=option_index.device).expand(option_index.shape[0], -1), torch.full_like(query_index, options)


class Decision2Family(Family):
    name = "decision2"
    input_names = ("input_ids", "attention_mask", "position_ids", "option_index", "option_mask", "query_index")
    shared_input_names = ("prefix_ids", "input_ids", "attention_mask", "option_index", "option_mask", "query_index")
    output_name = "logits"
    dynamic_axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "option_index": {0: "batch", 1: "options"},
        "option_mask": {0: "batch", 1: "options"},
        "query_index": {0: "batch"},
    }
    numerics_policy = {"cpu": FP32, "gpu": BF16_AUTOCAST}
    export_spec = ExportSpec(quantized_towers=("backbone.",), embedding_tables=("backbone.embed_tokens.weight",))

    def __init__(self, ref: PackageRef, package: pkg.Decision2Package):
        super().__init__(ref, package)
        self.tokenizer = load_plain_tokenizer(package.root)
        self.pad_id = pad_token_id(package.root, self.tokenizer)
        self.merge_adapter = False

    @classmethod
    def detect(cls, root: Path) -> bool:
        return pkg.detect(root)

    def export_module(self, numerics: Numerics, *, weights: bool = True, readout_rows_only: bool = False) -> torch.nn.Module:
        self.merge_adapter = True  # LoRA merged into the base weights: one plain graph
        return super().export_module(numerics, weights=weights, readout_rows_only=readout_rows_only)

    @classmethod
    def open(cls, ref: PackageRef, *, base_path: Path | None = None, cache_dir=None, offline=None, **_: Any) -> "Decision2Family":
        def resolve_base(repo_id: str, revision: str) -> Path:
            return resolve_package(repo_id, revision, cache_dir=cache_dir, offline=offline).path

        return cls(ref, pkg.verify(ref.path, base_path=base_path, resolve_base=resolve_base))

    @property
    def parameter_count(self) -> int | None:
        return self.package.loaded_parameters or None

    @property
    def max_input_tokens(self) -> int:
        return self.package.max_input_tokens

    @property
    def reads_base_checkpoint(self) -> bool:
        return self.package.base is not None

    def readout_row_count(self, inputs: dict[str, np.ndarray]) -> int:
        return HeadRows.count(int(inputs["option_index"].shape[1]))

    # -- weights -------------------------------------------------------------------------------------
    def backbone_config(self):
        package = self.package
        if package.profile == "qwen-full":
            data = read_json(package.root, "backbone/config.json")
        else:
            base_config = read_json(package.base.path, "config.json")
            data = base_config.get("text_config", base_config)
        return text_config_from_dict(package.backbone_type, {**data, "model_type": package.backbone_type})

    def _backbone_files(self) -> tuple[list[Path], str, Path, str]:
        """The backbone's weight files, their key prefix, the folder they are under, and where they come from."""
        package = self.package
        if package.profile == "qwen-full":
            return sorted((package.root / "backbone").glob("*.safetensors")), "", package.root, "backbone/"
        return sorted(package.base.path.glob("*.safetensors")), BASE_PREFIX, package.base.path, f"base:{package.base.repo_id}"

    def build_backbone(self, dtype: torch.dtype, weights: bool = True) -> torch.nn.Module:
        files, prefix, root, where = self._backbone_files()
        tensors = read_tensors(files, prefix, root) if weights else meta_tensors(tensor_index(files, prefix, root))
        if self.package.profile != "qwen-full":
            tensors = {k: v for k, v in tensors.items() if not k.startswith("mtp")}
        return build_text_model(self.package.backbone_type, self.backbone_config(), tensors, dtype, where)

    def weight_sources(self, numerics: Numerics) -> dict[str, WeightSource]:
        """The backbone's weights (the base's for an adapter package, the LoRA pairs merged in as PEFT merges them)."""
        files, prefix, root, _ = self._backbone_files()
        index = {k: ref for k, ref in tensor_index(files, prefix, root).items() if self.package.profile == "qwen-full" or not k.startswith("mtp")}
        deltas: dict[str, LoraDelta] = {}
        if self.package.profile == "qwen-adapter":
            config = read_json(self.package.root, "adapter/adapter_config.json")
            scaling = float(config["lora_alpha"]) / float(config["r"])
            adapter = tensor_index([self.package.root / "adapter" / "adapter_model.safetensors"], "base_model.model.", self.package.root)
            for key in adapter:
                if key.endswith(".lora_A.weight"):
                    target = key[: -len(".lora_A.weight")]
                    deltas[f"{target}.weight"] = LoraDelta(adapter[key], adapter[f"{target}.lora_B.weight"], scaling)
        return {f"backbone.{k}": WeightSource(ref, numerics.parameter_dtype, deltas.get(k)) for k, ref in index.items()}

    def build_head(self) -> CandidateHead:
        state = load_file(str(self.package.root / "decision_head.safetensors"))
        hidden = state["candidate_norm.weight"].shape[0]
        head_dim = int(self.package.decision_config["head_dim"])
        if state["key.weight"].shape != (head_dim, hidden):
            raise PackageError(f"key.weight is {tuple(state['key.weight'].shape)}, expected ({head_dim}, {hidden})", "decision_head.safetensors")
        head = CandidateHead(hidden, head_dim)
        head.load_state_dict(state, strict=True)
        return head.eval()

    def build_module(self, numerics: Numerics, device: torch.device, *, weights: bool = True) -> torch.nn.Module:
        """Without `weights`, the backbone's parameters are meta tensors (see weight_sources) and an adapter
        package's module is its merged form, which has the base's parameters."""
        backbone = self.build_backbone(numerics.parameter_dtype, weights)
        if self.package.profile == "qwen-adapter":
            if not weights and not self.merge_adapter:
                raise PackageError("a module without weights is built merged (the exporter's form) only")
            if weights:
                backbone = self.apply_adapter(backbone, merge=self.merge_adapter)
        module = Decision2Module(backbone, self.build_head(), numerics.autocast_dtype)
        loaded = sum(p.numel() for p in module.parameters())
        if not self.merge_adapter and loaded != self.package.loaded_parameters:
            raise PackageError(f"loaded {loaded} parameters, the manifest says {self.package.loaded_parameters}", "MODEL_MANIFEST.json")
        return module.to(device).eval() if weights else module.eval()

    def apply_adapter(self, backbone: torch.nn.Module, *, merge: bool) -> torch.nn.Module:
        """PEFT LoRA with FP32 factors, unmerged (the reference) or merged into the base weights (export)."""
        from peft import PeftModel

        config = read_json(self.package.root, "adapter/adapter_config.json")
        if config.get("peft_type") != "LORA" or config.get("bias", "none") != "none":
            raise PackageError("adapter must be a PEFT LORA adapter with bias none", "adapter/adapter_config.json")
        model = PeftModel.from_pretrained(backbone, str(self.package.root / "adapter"), is_trainable=False, autocast_adapter_dtype=False)
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.data = param.data.float()
        if merge:
            return model.merge_and_unload()
        return model.get_base_model()

    # -- requests ------------------------------------------------------------------------------------
    def render(self, state: Any, question: Question) -> RenderedQuestion:
        return render_question(state, question, self.tokenizer, self.max_input_tokens)

    def batches(self, rendered: list[RenderedQuestion]) -> list[Batch]:
        """All rows in one pass, split only when the padded batch exceeds the token budget."""
        groups: list[list[RenderedQuestion]] = [[]]
        for item in rendered:
            trial = groups[-1] + [item]
            if groups[-1] and self.padded_width(trial) * len(trial) > FORWARD_TOKEN_BUDGET:
                groups.append([item])
            else:
                groups[-1] = trial
        return [Batch(inputs=self.rows(group), items=group) for group in groups]

    def rows(self, group: list[RenderedQuestion]) -> dict[str, np.ndarray]:
        return batch_rows(group, self.pad_id)

    def padded_width(self, group: list[RenderedQuestion]) -> int:
        return -(-max(len(r.token_ids) for r in group) // ROW_MULTIPLE) * ROW_MULTIPLE

    def share_limit(self, item: RenderedQuestion) -> int:
        return item.option_ends[0]  # every option endpoint (and the query) stays in the suffix

    def shared_rows(self, prefix_length: int, items: list[RenderedQuestion]) -> dict[str, np.ndarray]:
        prefix_ids, input_ids, attention_mask, query_index = suffix_arrays(items, prefix_length, self.pad_id)
        widest = max(len(item.option_ends) for item in items)
        option_index = np.zeros((len(items), widest), dtype=np.int64)
        option_mask = np.zeros((len(items), widest), dtype=bool)
        for row, item in enumerate(items):
            option_index[row, : len(item.option_ends)] = [end - prefix_length for end in item.option_ends]
            option_mask[row, : len(item.option_ends)] = True
        return {
            "prefix_ids": prefix_ids, "input_ids": input_ids, "attention_mask": attention_mask,
            "option_index": option_index, "option_mask": option_mask, "query_index": query_index,
        }  # fmt: skip

    def answer(self, item: RenderedQuestion, output_row: np.ndarray) -> dict:
        return answer_from_logits(
            item.question,
            output_row.tolist(),
            temperature_by_type=self.package.temperature_by_type,
            score_offsets=self.package.score_offsets,
        )

    def card(self) -> dict:
        card = super().card()
        card.update(
            {
                "backbone": self.package.backbone_type,
                "profile_kind": self.package.profile,
                "parameters": self.parameter_count,
                "question_types": ["choice", "noul", "score"],
                "modalities": ["text"],
            }
        )
        return card
