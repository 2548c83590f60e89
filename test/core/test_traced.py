"""ShapeTracedModule: the vision backbone through a frozen trace per input shape, eager on trouble."""

from __future__ import annotations

import logging
import sys

import pytest
import torch
from torch import nn

from heisd_ros.core.traced import ShapeTracedModule
from heisd_ros.models.loader import tiny_vla


GRAPH_KINDS = {"openvino": "OpenVinoGraph", "onnxruntime": "OnnxRuntimeGraph", "torchscript": "RecursiveScriptModule"}


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime", "torchscript"])
def test_traced_backbone_matches_eager_and_traces_once_per_shape(runtime):
    torch.manual_seed(0)
    backbone = tiny_vla(seed=0).vision_backbone
    traced = ShapeTracedModule(backbone, runtime)
    a, b = torch.randn(2, 3, 64, 64), torch.randn(1, 3, 64, 64)
    with torch.inference_mode():  # as the engine calls it
        for x in (a, b, a):
            torch.testing.assert_close(traced(x), backbone(x), atol=1e-5, rtol=1e-5)
    assert len(traced._traces) == 2 and not traced.eager_only
    kinds = {type(fn).__name__ for fn in traced._traces.values()}
    assert kinds == {GRAPH_KINDS[runtime]}


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_exported_runtimes_take_float32_cpu_inputs_only(runtime):
    backbone = tiny_vla(seed=0).vision_backbone.to(torch.bfloat16)
    traced = ShapeTracedModule(backbone, runtime)
    x = torch.randn(1, 3, 64, 64, dtype=torch.bfloat16)
    assert traced.runtime_for(x) == "torchscript" and traced.runtime_for(x.float()) == runtime
    with torch.inference_mode():
        torch.testing.assert_close(traced(x), backbone(x))
    assert [type(fn).__name__ for fn in traced._traces.values()] == ["RecursiveScriptModule"]


class _NotExportable(nn.Module):
    """cummax has no ONNX export (opset 17), and traces. `scale` gives each test its own weights
    (what runtimes could not take a module is remembered per process by its weights)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(scale))

    def forward(self, x):
        return torch.cummax(x, dim=-1).values * self.scale


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_a_module_onnx_cannot_take_runs_its_trace_with_a_warning(runtime, caplog):
    scale = {"openvino": 2.0, "onnxruntime": 3.0}[runtime]
    traced = ShapeTracedModule(_NotExportable(scale).eval(), runtime)
    x = torch.randn(2, 5)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        torch.testing.assert_close(traced(x), torch.cummax(x, dim=-1).values * scale)
    assert not traced.eager_only and "runs its torchscript graph" in caplog.text and "cummax" in caplog.text
    # another shape, or another instance of the same weights, goes straight to the trace
    again = ShapeTracedModule(_NotExportable(scale).eval(), runtime)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        caplog.clear()
        again(torch.randn(3, 5))
    assert again.runtime_for(x) == "torchscript" and "cummax" not in caplog.text
    assert [type(fn).__name__ for fn in again._traces.values()] == ["RecursiveScriptModule"]


def test_without_openvino_the_backbone_runs_on_onnxruntime(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "openvino", None)  # as on a machine where it is not installed
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()  # weights no other test has used
    traced = ShapeTracedModule(backbone, "openvino")
    x = torch.randn(1, 3, 16, 16)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        torch.testing.assert_close(traced(x), backbone(x), atol=1e-5, rtol=1e-5)
    assert [type(fn).__name__ for fn in traced._traces.values()] == ["OnnxRuntimeGraph"]
    assert "runs its onnxruntime graph" in caplog.text and "openvino" in caplog.text
    assert traced.runtime_for(x) == "onnxruntime"


def test_an_openvino_graph_is_compiled_per_thread_count_in_float32():
    import openvino as ov

    backbone = tiny_vla(seed=0).vision_backbone
    x = torch.randn(1, 3, 64, 64)
    graphs = ShapeTracedModule(backbone, "openvino")
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for n in (1, 2):
                torch.set_num_threads(n)
                graphs(x)
    finally:
        torch.set_num_threads(threads)
    assert sorted(key[-1] for key in graphs._traces) == [1, 2]
    compiled = {key[-1]: fn.compiled for key, fn in graphs._traces.items()}
    assert {n: c.get_property("INFERENCE_NUM_THREADS") for n, c in compiled.items()} == {1: 1, 2: 2}
    assert all(c.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32 for c in compiled.values())


def test_an_onnx_session_is_made_per_thread_count_and_a_trace_serves_any():
    backbone = tiny_vla(seed=0).vision_backbone
    x = torch.randn(1, 3, 64, 64)
    sessions, traces = ShapeTracedModule(backbone, "onnxruntime"), ShapeTracedModule(backbone, "torchscript")
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for n in (1, 2):
                torch.set_num_threads(n)
                sessions(x)
                traces(x)
    finally:
        torch.set_num_threads(threads)
    assert sorted(key[-1] for key in sessions._traces) == [1, 2]
    assert len(traces._traces) == 1
    options = next(iter(sessions._traces.values())).session.get_session_options()
    assert options.intra_op_num_threads in (1, 2) and options.inter_op_num_threads == 1


def test_eager_runtime_never_builds_a_graph():
    backbone = tiny_vla(seed=0).vision_backbone
    traced = ShapeTracedModule(backbone, "eager")
    with torch.inference_mode():
        torch.testing.assert_close(traced(torch.ones(1, 3, 64, 64)), backbone(torch.ones(1, 3, 64, 64)))
    assert traced.eager_only and not traced._traces
    with pytest.raises(ValueError, match="unknown vision runtime"):
        ShapeTracedModule(backbone, "tensorrt")


class _Unstable(nn.Module):
    """Output changes from call to call: a trace cannot be checked against eager."""

    def forward(self, x):
        return x + torch.rand_like(x)


class _NotTraceable(nn.Module):
    def forward(self, x):
        return {"features": x * 2, "shape": list(x.shape)}  # a dict holding a list: the tracer refuses


@pytest.mark.parametrize("module, reason", [(_Unstable().eval(), "differs"), (_NotTraceable().eval(), "")])
def test_untraceable_modules_fall_back_to_eager_with_a_warning(module, reason, caplog):
    traced = ShapeTracedModule(module)
    x = torch.ones(2, 3)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        out = traced(x)
        traced(x)
    assert traced.eager_only and reason in traced.reason
    assert "stays eager" in caplog.text and caplog.text.count("stays eager") == 1
    if isinstance(out, dict):
        assert torch.equal(out["features"], x * 2)
    else:
        assert torch.all((out >= 1) & (out < 2))


def test_training_mode_is_never_traced():
    lin = nn.Linear(3, 2).train()
    traced = ShapeTracedModule(lin)
    x = torch.ones(1, 3, requires_grad=True)
    traced(x).sum().backward()
    assert x.grad is not None and not traced._traces
