"""The eager PyTorch engine: runs a family's module on a device."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from vllm_sr_runtime.engines import ModelSource
from vllm_sr_runtime.engines.feature_memo import FeatureMemo, Modalities, vision_inputs
from vllm_sr_runtime.interrupts import Interruptible


class TorchEngine(Interruptible):
    name = "torch"
    golden: dict | None = None  # eager PyTorch is the reference: nothing recorded to replay

    def __init__(
        self, module: torch.nn.Module, device: torch.device, input_names: tuple[str, ...], shared_input_names: tuple[str, ...] = (),
        media_modalities: Modalities = (),
    ):  # fmt: skip
        self.module = module
        self.device = device
        self.input_names = input_names
        self.shared_input_names = shared_input_names
        self.media_modalities = media_modalities  # empty: the module reads no media
        self.memo = FeatureMemo(media_modalities)  # vision features of the request being answered
        # An interrupted pass ends before the next module it calls (a projection, a norm, a layer): on CPU one decoder
        # layer of a long batch can take tens of seconds. A check costs ~1 us; a forward calls ~70-1,000 modules.
        for child in module.modules():
            child.register_forward_pre_hook(self._stop_if_interrupted)

    def _stop_if_interrupted(self, *_: object) -> None:
        if self.interrupt is not None:
            self.interrupt.check()

    def _tensors(self, inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(np.ascontiguousarray(inputs[name])).to(self.device) for name in names}

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            output = self.module(**self._tensors(inputs, self.input_names))
        return output.float().cpu().numpy()

    def forward_shared(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """A shared_context pass: the prefix once, then the suffix rows from its cache."""
        with torch.inference_mode():
            output = self.module.forward_shared(**self._tensors(inputs, self.shared_input_names))
        return output.float().cpu().numpy()

    @property
    def reads_media(self) -> bool:
        return bool(self.media_modalities)

    def weight_bytes(self) -> int:
        """The bytes of the module's parameters and buffers on its device (a tied weight once)."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*self.module.parameters(), *self.module.buffers()]}
        return sum(storages.values())

    def forward_media(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Rows that read images/videos: the vision tower (once per request), its features in place of the
        placeholders (the module's forward_media, in two steps)."""
        with torch.inference_mode():
            output = forward_with_features(self.module, inputs, self.memo, self._tensors)
        return output.float().cpu().numpy()


def forward_with_features(
    module: torch.nn.Module, inputs: dict[str, np.ndarray], memo: FeatureMemo, tensors: Callable[[dict[str, np.ndarray], tuple[str, ...]], dict[str, torch.Tensor]]
) -> torch.Tensor:  # fmt: skip
    """A media batch's output: the module's vision tower without gradients (once per request's pixels, through `memo`),
    then its forward_features over those features under the caller's grad mode (int8 calibration backpropagates
    through the text tower). `tensors(inputs, names)`: the named inputs as tensors where the module runs."""
    with torch.no_grad():
        features = memo.features(inputs, lambda pixels, grid: module.visual_features(*tensors(inputs, (pixels, grid)).values()), lambda: module.visual_features(None, None))
    skipped = vision_inputs(memo.modalities)
    return module.forward_features(**tensors(inputs, tuple(name for name in inputs if name not in skipped)), **features)


def build(family: ModelSource, device, profile, **_: object) -> tuple[TorchEngine, str]:
    """The torch engine plugin: the family's module in its numerics policy for the device's class."""
    numerics = family.numerics(device.device_class)
    module = family.build_module(numerics, device.torch_device)
    modalities = family.media_modalities if family.reads_media else ()
    return TorchEngine(module, device.torch_device, family.input_names, family.shared_input_names, modalities), numerics.label


def expected_weight_bytes(family: ModelSource, device, profile, **_: object) -> int | None:
    """Before the module is built: the package's parameters in the dtype the device's numerics policy holds them."""
    return parameter_bytes(family, device.device_class)


def parameter_bytes(family: ModelSource, device_class: str) -> int | None:
    """The package's parameters in the dtype the family's numerics policy holds them on a device class (cpu | gpu)."""
    count = family.parameter_count
    if count is None:
        return None
    return count * torch.empty((), dtype=family.numerics(device_class).parameter_dtype).element_size()


build.expected_weight_bytes = expected_weight_bytes  # type: ignore[attr-defined]
