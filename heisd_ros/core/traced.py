"""A module called through a frozen graph per input shape (the vision backbone).

The vision backbone runs on every control step with the same input shape (views × 3 × S × S), and
it is the largest fixed cost of a step on a CPU. A frozen graph removes the eager dispatch
overhead; an inference runtime's graph (fused convolutions and activations, blocked layouts, JIT
kernels for the processor's vector units) is faster still. EfficientNet-Lite0 at 128 px, one view,
one thread, caches evicted between calls, on an Intel Xeon with AVX-512 (benchmarks/vision_runtime.json):
OpenVINO 3.8 ms, ONNX Runtime 5.8 ms, the frozen TorchScript trace 8.8 ms, eager 11.4 ms.
The runtime (`vision_runtime`):
- 'openvino': the module exported to ONNX for the input shape and compiled by OpenVINO's CPU
  plugin in float32 with torch's thread count (float32 CPU inputs only; others use 'torchscript');
- 'onnxruntime': the same export run by an ONNX Runtime session;
- 'torchscript': a frozen TorchScript trace;
- 'eager': the module itself.
An exported runtime that cannot run (not installed, or its graph fails) hands over to the next one
in that order. A graph is specific to one shape, dtype and device, so one is made lazily per key.
The first graph of a module is checked against the eager output; any failure or mismatch logs a
warning and falls back to eager calls for good (a backbone that cannot be exported still works,
only slower).

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
import threading
import warnings
from typing import Callable

import torch
from torch import nn

log = logging.getLogger(__name__)

RUNTIMES = ("openvino", "onnxruntime", "torchscript", "eager")

EXPORTED = ("openvino", "onnxruntime")
"""Runtimes that take the module as an ONNX export (float32 CPU inputs), in hand-over order."""

MAX_ABS_DIFF = 1e-3
"""Largest element-wise difference from the eager output a graph may have (fp32 rounding: ~1e-5)."""

ONNX_OPSET = 17

_SHARED_GRAPHS: dict[tuple, Callable[[torch.Tensor], torch.Tensor]] = {}
"""(weights digest, runtime, shape, dtype, device[, threads]) -> graph, for every ShapeTracedModule
of the process (an exported runtime's graph is made for a thread count; a trace serves any)."""

_UNUSABLE: dict[tuple[str, str], str] = {}
"""(weights digest, exported runtime) -> why that runtime could not take that module: not tried
again for another shape (a large backbone's export is long before it fails, e.g. at protobuf's 2 GB)."""


def weights_digest(module: nn.Module) -> str:
    """A digest of the module's parameters and buffers (names, shapes, dtypes, bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class ExportError(RuntimeError):
    """The module has no ONNX export: no exported runtime can take it."""


def onnx_export(module: nn.Module, sample: torch.Tensor) -> bytes:
    """The module as an ONNX graph for the sample's shape (input "x", output "y")."""
    exported = io.BytesIO()
    try:
        torch.onnx.export(module, (sample,), exported, dynamo=False, opset_version=ONNX_OPSET,
                          input_names=["x"], output_names=["y"])
    except Exception as err:  # noqa: BLE001 - the exporter raises many kinds
        raise ExportError(f"{type(err).__name__}: {err}") from err
    return exported.getvalue()


class OnnxRuntimeGraph:
    """`module(x)` for one input shape through an ONNX Runtime session (float32 CPU tensors)."""

    def __init__(self, module: nn.Module, sample: torch.Tensor) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        # torch's thread count, as the rest of the step; 1 runs the graph on the calling thread
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        # workers that spin after a run would take the cores from the language model's forwards
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(onnx_export(module, sample), options, providers=["CPUExecutionProvider"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {"x": x.detach().contiguous().numpy()})[0])


class OpenVinoGraph:
    """`module(x)` for one input shape compiled by OpenVINO's CPU plugin (float32 CPU tensors)."""

    def __init__(self, module: nn.Module, sample: torch.Tensor) -> None:
        import openvino as ov

        core = ov.Core()
        model = core.read_model(onnx_export(module, sample), b"")
        self.compiled = core.compile_model(model, "CPU", {
            # float32 as the policy was trained: on processors with AMX or AVX512-BF16 the plugin
            # would otherwise run in bfloat16 and move the features by ~1e-3
            "INFERENCE_PRECISION_HINT": "f32",
            "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            # the step's other stages run on torch's threads: no core is reserved for this graph
            "ENABLE_CPU_PINNING": False,
        })
        self.request = self.compiled.create_infer_request()
        self._lock = threading.Lock()  # graphs are shared by the process; a request runs one call at a time

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.request.infer({0: x.detach().contiguous().numpy()})
            return torch.from_numpy(self.request.get_output_tensor(0).data.copy())  # the request reuses its buffer


class ShapeTracedModule:
    """`module(x)` through a frozen graph for x's (shape, dtype, device; for an exported runtime
    also torch's thread count); eager on any trouble."""

    def __init__(self, module: nn.Module, runtime: str = "openvino") -> None:
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
        """The runtime x's graph uses: an exported runtime takes float32 CPU inputs only, of a
        module it could take (else the next exported runtime, then 'torchscript')."""
        if self.runtime not in EXPORTED:
            return self.runtime
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return "torchscript"
        self._digest = self._digest or weights_digest(self.module)
        usable = [r for r in EXPORTED[EXPORTED.index(self.runtime):] if (self._digest, r) not in _UNUSABLE]
        return usable[0] if usable else "torchscript"

    def _trace(self, x: torch.Tensor, first: str):
        failures = []
        order = (*EXPORTED[EXPORTED.index(first):], "torchscript") if first in EXPORTED else (first,)
        for runtime in dict.fromkeys(order):  # an unexportable module may still trace
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
                if runtime in EXPORTED and self._digest:
                    # an export that failed fails for every exported runtime: it is not tried again
                    for out in EXPORTED if isinstance(err, ExportError) else (runtime,):
                        _UNUSABLE[self._digest, out] = f"{type(err).__name__}: {err}"
                return None, f"{runtime}: {type(err).__name__}: {err}"
        if not diff <= MAX_ABS_DIFF:
            if runtime in EXPORTED:
                _UNUSABLE[self._digest, runtime] = f"output differs from eager by {diff:.2e}"
            return None, f"{runtime} graph's output differs from eager by {diff:.2e}"
        _SHARED_GRAPHS[shared] = fn
        return fn, ""

    def _give_up(self, reason: str) -> None:
        self.eager_only = True
        self.reason = reason
        log.warning("vision backbone stays eager (graph unusable: %s)", reason[:300])
        return None


def _key(x: torch.Tensor, runtime: str) -> tuple:
    """A graph's key: the input's shape, dtype and device; an exported runtime's graph is also made
    for torch's thread count (a trace serves any)."""
    key = (tuple(x.shape), x.dtype, str(x.device))
    return key + (torch.get_num_threads(),) if runtime in EXPORTED else key


def _build(runtime: str, module: nn.Module, sample: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    if runtime == "openvino":
        return OpenVinoGraph(module, sample)
    if runtime == "onnxruntime":
        return OnnxRuntimeGraph(module, sample)
    return torch.jit.freeze(torch.jit.trace(module, sample))
