"""A run nobody waits for any more stops early on the real engines: no further pass starts, the torch engine stops
before the next module it calls, ONNX Runtime's pass ends on its terminate flag; the engine answers the next run as
before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vllm_sr_runtime
from vllm_sr_runtime.interrupts import Interrupt, Interrupted
from vllm_sr_runtime.model import DecisionModel

STATE = "Merge two sorted lists, then count the words of every line."
QUESTIONS = {f"q{i}": {"type": "noul", "instructions": f"Does it mention topic {i}?"} for i in range(12)}  # two passes of d3


def probabilities(answers: dict) -> list[float]:
    return [answer["noul"] for answer in answers.values()]


class PassesWhole:
    """An engine that cannot stop a pass in flight (no `interruptible`), as a plugin's may be."""

    name = "passes-whole"
    golden = None

    def __init__(self, engine):
        self.engine, self.passes = engine, 0

    def forward(self, inputs):
        self.passes += 1
        return self.engine.forward(inputs)


def test_no_pass_starts_once_the_run_is_interrupted(models):
    reference = models("d3")
    engine = PassesWhole(reference.engine)
    model = DecisionModel(reference.family, engine, "exact", reference.device, reference.dtype)
    plan = model.plan(STATE, QUESTIONS)
    assert len(plan.batches) == 2
    interrupt, passes = Interrupt(), []

    def after_pass(batch) -> None:
        passes.append(batch)
        interrupt.set()  # the client left during the first pass

    with pytest.raises(Interrupted):
        model.execute(plan, on_batch=after_pass, interrupt=interrupt)
    assert len(passes) == 1 and engine.passes == 1


def test_the_reference_does_not_answer_close_calls_again_once_the_run_is_interrupted(models):
    reference_model = models("d3")
    interrupt = Interrupt()

    class SetsInterrupt(PassesWhole):
        def forward(self, inputs):
            outputs = super().forward(inputs)
            interrupt.set()  # the client left during the fast engine's pass
            return outputs

    fast, reference = SetsInterrupt(reference_model.engine), PassesWhole(reference_model.engine)
    model = DecisionModel(reference_model.family, fast, "batching", reference_model.device, reference_model.dtype)
    model.confirm_close_calls(1.0, lambda: (reference, "fp32"))  # every answer is a close call
    with pytest.raises(Interrupted):
        model.execute(model.plan(STATE, QUESTIONS), interrupt=interrupt)
    assert fast.passes == 1 and reference.passes == 0


def test_the_torch_engine_stops_before_the_next_module_it_calls_and_then_answers_as_before(models):
    model = models("d3")
    expected = probabilities(model.ask(STATE, QUESTIONS))
    first_layer = next(layer for stack in model.engine.module.modules() if isinstance(stack, torch.nn.ModuleList) for layer in stack)
    called: list[torch.nn.Module] = []  # the order the first layer calls its modules in (not the order they are declared)
    hooks = [child.register_forward_pre_hook(lambda module, args: called.append(module)) for child in first_layer.modules()]
    model.ask(STATE, {"q": QUESTIONS["q0"]})
    for hook in hooks:
        hook.remove()
    projection = next(child for child in called if isinstance(child, torch.nn.Linear))
    finished, interrupt = [], Interrupt()
    hooks = [child.register_forward_hook(lambda module, args, output: finished.append(module)) for child in model.engine.module.modules()]
    hooks.append(projection.register_forward_hook(lambda *_: interrupt.set()))  # set mid-layer, as the pass runs
    try:
        with pytest.raises(Interrupted):
            model.execute(model.plan(STATE, QUESTIONS), interrupt=interrupt)
    finally:
        for hook in hooks:
            hook.remove()
    assert finished[-1] is projection and first_layer not in finished  # nothing ran after it, not even the rest of its layer
    assert model.engine.interrupt is None
    assert probabilities(model.ask(STATE, QUESTIONS)) == expected


@pytest.fixture(scope="module")
def max_speed(packages, default_artifact):
    return vllm_sr_runtime.load(packages["d3"], profile="max_speed", artifact=default_artifact("d3"))


@pytest.mark.parametrize("binding", ["run", "io_binding"])
def test_onnx_runtime_ends_its_pass_on_the_terminate_flag_and_then_answers_as_before(max_speed, binding, monkeypatch):
    """`io_binding`: the path the engine takes on CUDA (kept device buffers), here with CPU buffers."""
    from vllm_sr_runtime.engines.onnxruntime.io_binding import DeviceBuffers

    engine = max_speed.engine
    if binding == "io_binding":
        monkeypatch.setattr(engine, "buffers", DeviceBuffers("cpu", 0))
    batch = max_speed.plan(STATE, QUESTIONS).batches[0]
    expected = engine.forward(batch.inputs)
    interrupt = Interrupt()
    interrupt.set()
    with engine.interruptible(interrupt), pytest.raises(Interrupted):  # the model's check is passed by: the session's run must stop
        engine.forward(batch.inputs)
    assert engine.interrupt is None
    np.testing.assert_array_equal(engine.forward(batch.inputs), expected)
    with engine.interruptible(Interrupt()):  # an interrupt never set changes nothing
        np.testing.assert_array_equal(engine.forward(batch.inputs), expected)
    assert binding == "run" or engine.buffers.allocations > 0  # the runs went through the device buffers
