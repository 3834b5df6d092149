"""What every family provides: verification, rendering to rows, a torch module, and answers from outputs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from vllm_sr_runtime.errors import QuestionError
from vllm_sr_runtime.families.answers import error_answer
from vllm_sr_runtime.families.questions import Question, parse_questions
from vllm_sr_runtime.families.weights import WeightSource
from vllm_sr_runtime.numerics import Numerics
from vllm_sr_runtime.packages.resolve import PackageRef


@dataclass(frozen=True)
class ExportSpec:
    """What the exporter needs of a family, declared by the family in one place (optimum-style) instead of
    probed: the towers `--dtype int8` quantizes (everything else, the readout that produces the answer, stays
    FP32) and the token embedding tables it may store as int8. The prepare steps (merging an adapter, a mask that must trace) live in `Family.export_module`."""

    quantized_towers: tuple[str, ...]
    embedding_tables: tuple[str, ...] = ()  # the token embedding weights `--int8-embedding int8` stores as int8 rows


@dataclass
class Batch:
    inputs: dict[str, np.ndarray]
    items: list[Any]  # the family's rendered questions, one per row
    shared: bool = False  # profile `shared_context`: a prefix pass, then suffix rows continuing from it
    media: bool = False  # rows that read images/videos: the module's forward_media (one request's rows only)


@dataclass
class Plan:
    questions: list[Question]
    errors: dict[str, dict] = field(default_factory=dict)
    batches: list[Batch] = field(default_factory=list)
    profile: str | None = None  # the profile the request runs under (set by the model that plans it)

    @property
    def input_tokens(self) -> int:
        return sum(len(item.token_ids) + getattr(item, "visual_tokens", 0) for batch in self.batches for item in batch.items)


class Family(ABC):
    name: ClassVar[str]
    input_names: ClassVar[tuple[str, ...]]
    shared_input_names: ClassVar[tuple[str, ...]]  # the module's forward_shared inputs
    output_name: ClassVar[str]
    # Axis names of each input that vary between calls (one exported graph serves them all).
    dynamic_axes: ClassVar[dict[str, dict[int, str]]]
    # Families whose module reads images/videos: the inputs and axes of its forward_features (text tower over
    # the vision tower's features); empty for text-only families.
    media_input_names: ClassVar[tuple[str, ...]] = ()
    media_dynamic_axes: ClassVar[dict[str, dict[int, str]]] = {}
    # Media families: (pixel input, grid input, feature input of the media text graph) per modality; engines
    # run the vision tower once per pixel array and feed its features through these names.
    media_modalities: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    # The side `rows` pads shorter rows on; a graph with a static sequence length pads there too.
    padding_side: ClassVar[str] = "right"
    # The numerics policy: per device class (cpu | gpu), how the module's parameters and compute are held.
    numerics_policy: ClassVar[dict[str, Numerics]]
    # What `export` needs (None: the family has no exported graphs; profiles that run artifacts refuse it).
    export_spec: ClassVar[ExportSpec | None] = None
    # Profile name -> the engine plugin that runs it for this family, in place of the profile's own engine.
    engines: ClassVar[dict[str, str]] = {}
    # The profiles this family runs (None: every installed profile).
    profiles: ClassVar[tuple[str, ...] | None] = None
    pad_id: int

    def __init__(self, ref: PackageRef, package: Any):
        self.ref = ref
        self.package = package

    @property
    def reads_media(self) -> bool:
        """Whether this package reads images and videos (a vision tower)."""
        return False

    @property
    def reads_base_checkpoint(self) -> bool:
        """Whether this package is an adapter over a base checkpoint (what `base_path` points at)."""
        return False

    def numerics(self, device_class: str) -> Numerics:
        return self.numerics_policy[device_class]

    def export_module(self, numerics: Numerics, *, weights: bool = True, readout_rows_only: bool = False) -> torch.nn.Module:
        """The module `export` traces (prepare steps a family needs go in its override). `readout_rows_only`: its
        last layer computes only the rows the readout reads (families/readout_rows.py), the form graphs are traced
        in; the eager reference an export compares them with keeps the full model. The module's `prunes_last_layer`
        (absent: False) says whether it does (a sliding-window last layer does not), recorded in the artifact."""
        module = self.build_module(numerics, torch.device("cpu"), weights=weights).eval()
        module.readout_rows_only = readout_rows_only
        return module

    def allow_media_urls(self, hosts: tuple[str, ...], allow_private: bool, timeout_s: float) -> None:
        """The server's policy for http(s) media URLs; families that read no media ignore it."""

    def sequence_padding(self) -> dict:
        """How rows are padded to a longer static length without changing their answers: on the side the
        family pads, with the pad token, mask 0 and position 0 (masked tokens no real token attends to)."""
        return {"side": self.padding_side, "values": {"input_ids": int(self.pad_id), "attention_mask": 0, "position_ids": 0}}

    @property
    def shared_dynamic_axes(self) -> dict[str, dict[int, str]]:
        """Dynamic axes of forward_shared's inputs: the suffix rows vary like full rows, the prefix by length."""
        axes = {name: self.dynamic_axes[name] for name in self.shared_input_names if name in self.dynamic_axes}
        axes["prefix_ids"] = {1: "prefix"}
        axes.setdefault("query_index", {0: "batch"})
        return axes

    @classmethod
    @abstractmethod
    def detect(cls, root: Path) -> bool: ...

    @classmethod
    @abstractmethod
    def open(cls, ref: PackageRef, **options: Any) -> "Family":
        """Verify the package and load what rendering needs (no weights)."""

    # -- a torch module (the torch engine, export) ------------------------------------------------------
    # A family that runs only on its own engine (Family.engines) leaves these unimplemented.
    def backbone_config(self):
        """The transformers text config of the backbone (no weights read)."""
        raise NotImplementedError(f"family {self.name} has no transformers backbone")

    def build_module(self, numerics: Numerics, device: torch.device, *, weights: bool = True) -> torch.nn.Module:
        """The backbone + readout as one module: forward(**inputs) -> readout output [rows, ...]. Without
        `weights`, the large parameters are meta tensors (no memory) that `weight_sources` describes."""
        raise NotImplementedError(f"family {self.name} has no torch module (it runs on {', '.join(sorted(set(self.engines.values()))) or 'no engine'})")

    def weight_sources(self, numerics: Numerics) -> dict[str, WeightSource]:
        """Where each meta parameter of `build_module(weights=False)` is read from, by its name in the module."""
        raise NotImplementedError(f"family {self.name} has no torch module")

    @abstractmethod
    def render(self, state: Any, question: Question) -> Any:
        """One question's rendered form (raises QuestionError)."""

    @abstractmethod
    def batches(self, rendered: list[Any]) -> list[Batch]:
        """One request's passes, composed exactly as the released runtime composes them."""

    @abstractmethod
    def rows(self, group: list[Any]) -> dict[str, np.ndarray]:
        """The padded inputs of one pass over these rendered questions."""

    def pass_size(self, batch: Batch) -> tuple[int, int]:
        """(rows, padded tokens) of one pass, for the metrics: the shape of the family's first input."""
        first = batch.inputs[self.input_names[0]]
        return int(first.shape[0]), int(first.size)

    def padded_width(self, group: list[Any]) -> int:
        return max(len(item.token_ids) for item in group)

    def pack(self, rendered: list[Any], budget_tokens: int, max_rows: int = 256) -> list[Batch]:
        """Cross-request batching: rows sorted by length, packed greedily under a padded-token budget."""
        groups: list[list[Any]] = []
        current: list[Any] = []
        for item in sorted(rendered, key=lambda item: len(item.token_ids)):
            trial = current + [item]
            if current and (self.padded_width(trial) * len(trial) > budget_tokens or len(trial) > max_rows):
                groups.append(current)
                current = [item]
            else:
                current = trial
        if current:
            groups.append(current)
        return [Batch(inputs=self.rows(group), items=group) for group in groups]

    @abstractmethod
    def answer(self, item: Any, output_row: np.ndarray) -> dict: ...

    # -- profile shared_context ----------------------------------------------------------------------
    def share_limit(self, item: Any) -> int:
        """How many leading tokens of this rendered question may go to the shared prefix."""
        raise NotImplementedError(f"family {self.name} does not share prefixes")

    def shared_rows(self, prefix_length: int, items: list[Any]) -> dict[str, np.ndarray]:
        """Inputs of the module's forward_shared: `prefix_ids` [1, P] and the suffix rows."""
        raise NotImplementedError(f"family {self.name} does not share prefixes")

    def share(self, plan: Plan, min_saved_tokens: int) -> Plan:
        """Rewrites a plan into one shared pass when its questions share enough prefix to pay for it."""
        from vllm_sr_runtime.families.shared_context import common_prefix_length, worth_sharing

        items = [item for batch in plan.batches for item in batch.items]
        if len(items) < 2 or any(batch.media for batch in plan.batches):  # media rows run whole
            return plan
        prefix_length = common_prefix_length(items, self.share_limit)
        if worth_sharing(len(items), prefix_length, min_saved_tokens):
            plan.batches = [Batch(inputs=self.shared_rows(prefix_length, items), items=items, shared=True)]
        return plan

    @property
    @abstractmethod
    def max_input_tokens(self) -> int: ...

    @property
    def model_name(self) -> str:
        return self.package.model_name

    def prepare_media(self, images: Any, videos: Any) -> Any:
        """A request's decoded, preprocessed media (None when it has none). Families without a vision
        tower refuse media."""
        if images or videos:
            from vllm_sr_runtime.errors import InvalidRequest

            raise InvalidRequest(f"model {self.model_name} reads text only; it does not accept images or videos")
        if images is not None and not isinstance(images, list) or videos is not None and not isinstance(videos, list):
            from vllm_sr_runtime.errors import InvalidRequest

            raise InvalidRequest("'images' and 'videos' must be lists of data URLs")
        return None

    def render_media(self, state: Any, question: Question, media: Any) -> Any:
        raise NotImplementedError

    def media_batches(self, rendered: list[Any], media: Any) -> list[Batch]:
        raise NotImplementedError

    def plan(self, state: Any, questions: Any, images: Any = None, videos: Any = None, *, media: Any = None) -> Plan:
        """`media`: already prepared (what prepare_media returns), in place of `images` / `videos`."""
        plan = Plan(questions=parse_questions(questions))
        if media is None:
            media = self.prepare_media(images, videos)
        rendered = []
        for question in plan.questions:
            if question.problem is not None:
                plan.errors[question.id] = error_answer(question.type, question.problem.error, question.problem.message)
                continue
            try:
                rendered.append(self.render(state, question) if media is None else self.render_media(state, question, media))
            except QuestionError as problem:
                plan.errors[question.id] = error_answer(question.type, problem.error, problem.message)
        if rendered:
            plan.batches = self.batches(rendered) if media is None else self.media_batches(rendered, media)
        return plan

    @property
    def causal_attention(self) -> bool:
        """Whether each token's full attention reads only itself and the tokens before it."""
        return True

    def readout_row_count(self, inputs: dict[str, np.ndarray]) -> int:
        """How many positions of each row's last hidden state the readout reads (what an exported graph's last
        layer computes alone): the last token, unless a family reads more."""
        return 1

    @property
    def shared_context_exact(self) -> bool:
        """Whether profile shared_context computes what the full rows compute. True for causal models (the
        prefix never sees the questions); a model whose attention reads the prompt both ways loses the
        prefix -> question direction when the prefix runs once."""
        return self.causal_attention

    @property
    def parameter_count(self) -> int | None:
        """The parameters the model loads, as its package states them before any load; None where it does not."""
        return None

    @property
    def licence(self) -> dict | None:
        """The package's licence as its manifest states it (`{spdx, components}`), None where it states none."""
        return (getattr(self.package, "manifest", None) or {}).get("licence")

    def card(self) -> dict:
        package = self.package
        return {
            "family": self.name,
            "model_sha256": package.model_sha256,
            "manifest_sha256": package.manifest_sha256,
            "max_input_tokens": self.max_input_tokens,
            "shared_context": "exact" if self.shared_context_exact else "approximate",
            "licence": self.licence,
        }
