"""Runs with IO binding on a GPU: inputs copied into device buffers that are kept and reused while the
shapes repeat (the static-length graphs make them repeat), the output bound on the device and only it
(the probabilities, [rows, options]) copied back."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

KEPT_BUFFERS = 64  # input buffers kept per engine (name, shape, dtype), least recently used dropped first


class DeviceBuffers:
    def __init__(self, device_type: str, device_index: int = 0, kept: int = KEPT_BUFFERS):
        self.device_type, self.device_index, self.kept = device_type, int(device_index or 0), kept
        self._buffers: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self.allocations = 0  # device buffers created (the rest of the runs reused one)

    def _buffer(self, name: str, array: np.ndarray):
        import onnxruntime as ort

        key = (name, array.shape, array.dtype.str)
        value = self._buffers.get(key)
        if value is None:
            value = ort.OrtValue.ortvalue_from_numpy(array, self.device_type, self.device_index)
            self.allocations += 1
            self._buffers[key] = value
            while len(self._buffers) > self.kept:
                self._buffers.popitem(last=False)
        else:
            value.update_inplace(array)
            self._buffers.move_to_end(key)
        return value

    def run(self, session, output_name: str, feed: dict[str, np.ndarray], run_options=None) -> np.ndarray:
        with self._lock:
            binding = session.io_binding()
            for name, array in feed.items():
                binding.bind_ortvalue_input(name, self._buffer(name, np.ascontiguousarray(array)))
            binding.bind_output(output_name, self.device_type, self.device_index)
            session.run_with_iobinding(binding, run_options)
            return binding.copy_outputs_to_cpu()[0]
