"""A module called through a frozen graph per input shape (the vision backbone).

The vision backbone runs on every control step with the same input shape (views × 3 × S × S), and
it is the largest fixed cost of a step on a CPU. A frozen graph removes the eager dispatch
overhead; ONNX Runtime's graph (fused convolutions and activations, blocked layouts) is faster
still on a CPU: EfficientNet-Lite0 at 128 px, one view, one thread, 5.0 ms against 7.8 ms for the
frozen TorchScript trace and 10.4 ms eager (benchmarks/vision_runtime.json). The runtime (`vision_runtime`):
- 'onnxruntime': the module exported to ONNX for the input shape and run by an ONNX Runtime
  session with torch's thread count (float32 on the CPU only; other inputs use 'torchscript');
- 'torchscript': a frozen TorchScript trace;
- 'eager': the module itself.
A graph is specific to one shape, dtype and device, so one is made lazily per key. The first graph
of a module is checked against the eager output; any failure or mismatch logs a warning and falls
back to eager calls for good (a backbone that cannot be exported still works, only slower).

A frozen graph holds the module's weights as constants, and TorchScript never frees a compiled
graph: a graph per load would keep one copy of the backbone's weights per load (the node's every
configure/cleanup cycle grew by the mini backbone's 57 MB). So graphs are shared by the process,
keyed by a digest of the weights with the runtime and the input key: loading the same checkpoint
again reuses its graph, and only a different model adds one.
"""

from __future__ import annotations

import hashlib
import io
import logging
import warnings
from typing import Callable

import torch
from torch import nn

log = logging.getLogger(__name__)

RUNTIMES = ("onnxruntime", "torchscript", "eager")

MAX_ABS_DIFF = 1e-3
"""Largest element-wise difference from the eager output a graph may have (fp32 rounding: ~1e-5)."""

ONNX_OPSET = 17

_SHARED_GRAPHS: dict[tuple, Callable[[torch.Tensor], torch.Tensor]] = {}
"""(weights digest, runtime, shape, dtype, device[, threads]) -> graph, for every ShapeTracedModule
of the process (an ONNX Runtime session is made for a thread count; a trace serves any)."""

_NOT_EXPORTABLE: dict[str, str] = {}
"""Weights digest -> why ONNX Runtime could not take that module: not tried again for another
shape (a large backbone's export is long before it fails, e.g. at protobuf's 2 GB)."""


def weights_digest(module: nn.Module) -> str:
    """A digest of the module's parameters and buffers (names, shapes, dtypes, bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class OnnxRuntimeGraph:
    """`module(x)` for one input shape through an ONNX Runtime session (float32 CPU tensors)."""

    def __init__(self, module: nn.Module, sample: torch.Tensor) -> None:
        import onnxruntime as ort

        exported = io.BytesIO()
        torch.onnx.export(module, (sample,), exported, dynamo=False, opset_version=ONNX_OPSET,
                          input_names=["x"], output_names=["y"])
        options = ort.SessionOptions()
        # torch's thread count, as the rest of the step; 1 runs the graph on the calling thread
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        # workers that spin after a run would take the cores from the language model's forwards
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(exported.getvalue(), options, providers=["CPUExecutionProvider"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {"x": x.detach().contiguous().numpy()})[0])


class ShapeTracedModule:
    """`module(x)` through a frozen graph for x's (shape, dtype, device; for ONNX Runtime also
    torch's thread count); eager on any trouble."""

    def __init__(self, module: nn.Module, runtime: str = "onnxruntime") -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown vision runtime {runtime!r}; choose one of {RUNTIMES}")
        self.module = module
        self.runtime = runtime
        self._traces: dict[tuple, Callable[[torch.Tensor], torch.Tensor]] = {}
        self._digest = ""
        self.eager_only = runtime == "eager"
        self.reason = "vision_runtime 'eager'" if self.eager_only else ""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.eager_only or self.module.training:
            return self.module(x)
        runtime = self.runtime_for(x)
        fn = self._traces.get(_key(x, runtime))
        if fn is None:
            fn = self._trace(x, runtime)
            if fn is None:
                return self.module(x)
        return fn(x)

    def runtime_for(self, x: torch.Tensor) -> str:
        """The runtime x's graph uses: ONNX Runtime takes float32 CPU inputs only, of a module it
        could export."""
        if self.runtime != "onnxruntime":
            return self.runtime
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return "torchscript"
        self._digest = self._digest or weights_digest(self.module)
        return "torchscript" if self._digest in _NOT_EXPORTABLE else "onnxruntime"

    def _trace(self, x: torch.Tensor, first: str):
        failures = []
        for runtime in dict.fromkeys((first, "torchscript")):  # an unexportable module may still trace
            key = _key(x, runtime)
            fn, why = self._graph(runtime, x, key)
            if fn is not None:
                if failures:
                    log.warning("vision backbone runs its %s graph (%s)", runtime, failures[0][:300])
                self._traces[key] = fn
                return fn
            failures.append(why)
        return self._give_up("; ".join(failures))

    def _graph(self, runtime: str, x: torch.Tensor, key: tuple):
        """(the checked graph of `runtime` for x's key, '') or (None, why not)."""
        # Tracing records autograd-free ops, but not on inference tensors: trace on a normal copy.
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sample = x.detach().clone()
            try:
                self._digest = self._digest or weights_digest(self.module)
                shared = (self._digest, runtime, *key)
                fn = _SHARED_GRAPHS.get(shared)
                if fn is None:
                    fn = _build(runtime, self.module, sample)
                diff = float((fn(sample).float() - self.module(sample).float()).abs().max())
            except Exception as err:  # noqa: BLE001 - any exporter or runtime failure: this runtime is out
                if runtime == "onnxruntime" and self._digest:
                    _NOT_EXPORTABLE[self._digest] = f"{type(err).__name__}: {err}"
                return None, f"{runtime}: {type(err).__name__}: {err}"
        if not diff <= MAX_ABS_DIFF:
            if runtime == "onnxruntime":
                _NOT_EXPORTABLE[self._digest] = f"output differs from eager by {diff:.2e}"
            return None, f"{runtime} graph's output differs from eager by {diff:.2e}"
        _SHARED_GRAPHS[shared] = fn
        return fn, ""

    def _give_up(self, reason: str) -> None:
        self.eager_only = True
        self.reason = reason
        log.warning("vision backbone stays eager (graph unusable: %s)", reason[:300])
        return None


def _key(x: torch.Tensor, runtime: str) -> tuple:
    """A graph's key: the input's shape, dtype and device; an ONNX Runtime session is also made for
    torch's thread count (a trace serves any)."""
    key = (tuple(x.shape), x.dtype, str(x.device))
    return key + (torch.get_num_threads(),) if runtime == "onnxruntime" else key


def _build(runtime: str, module: nn.Module, sample: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    if runtime == "onnxruntime":
        return OnnxRuntimeGraph(module, sample)
    return torch.jit.freeze(torch.jit.trace(module, sample))
