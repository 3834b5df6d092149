"""Loaded at start by the Python of a test server whose PYTHONPATH names this folder (never by the runtime itself).
With VLLM_SR_TEST_FAULT set to a file path, a CPU device faults as a GPU does: the CPU accelerator classifies errors
with the GPU classifier, and the torch engine's first forward after that file appears removes it and raises the
sticky CUDA error an illegal memory access raises."""

import os

_flag = os.environ.get("VLLM_SR_TEST_FAULT")
if _flag:
    import dataclasses

    import torch

    from vllm_sr_runtime import accelerators
    from vllm_sr_runtime.engines.torch import TorchEngine

    accelerators.CPU = dataclasses.replace(accelerators.CPU, device_fault=accelerators.gpu_device_fault)
    _forward = TorchEngine.forward

    def _faulting_forward(self, inputs):
        if os.path.exists(_flag):
            os.unlink(_flag)
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        return _forward(self, inputs)

    TorchEngine.forward = _faulting_forward
