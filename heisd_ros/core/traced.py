"""A module called through a frozen TorchScript trace per input shape (the vision backbone).

The vision backbone runs on every control step with the same input shape (views × 3 × S × S), and
it is the largest fixed cost of a step on a CPU; a frozen trace removes the eager dispatch
overhead (about a fifth of the backbone's time for EfficientNet-Lite0 on one thread). A trace is
specific to one shape, dtype and device, so one is made lazily per key. The first trace of a module is checked
against the eager output; any failure or mismatch logs a warning and falls back to eager calls for
good (a backbone that cannot be traced still works, only slower).

A frozen graph holds the module's weights as constants, and TorchScript never frees a compiled
graph: a trace per load would keep one copy of the backbone's weights per load (the node's every
configure/cleanup cycle grew by the mini backbone's 57 MB). So traces are shared by the process,
keyed by a digest of the weights with the input key: loading the same checkpoint again reuses its
trace, and only a different model adds one.
"""

from __future__ import annotations

import hashlib
import logging
import warnings

import torch
from torch import nn

log = logging.getLogger(__name__)

MAX_ABS_DIFF = 1e-3
"""Largest element-wise difference from the eager output a trace may have (fp32 rounding: ~1e-5)."""

_SHARED_TRACES: dict[tuple, torch.jit.ScriptModule] = {}
"""(weights digest, shape, dtype, device) -> frozen trace, for every ShapeTracedModule of the process."""


def weights_digest(module: nn.Module) -> str:
    """A digest of the module's parameters and buffers (names, shapes, dtypes, bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class ShapeTracedModule:
    """`module(x)` through a frozen trace for x's (shape, dtype, device); eager on any trouble."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._traces: dict[tuple, torch.jit.ScriptModule] = {}
        self._digest = ""
        self.eager_only = False
        self.reason = ""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.eager_only or self.module.training:
            return self.module(x)
        key = (tuple(x.shape), x.dtype, str(x.device))
        fn = self._traces.get(key)
        if fn is None:
            fn = self._trace(x, key)
            if fn is None:
                return self.module(x)
        return fn(x)

    def _trace(self, x: torch.Tensor, key: tuple):
        # Tracing records autograd-free ops, but not on inference tensors: trace on a normal copy.
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sample = x.detach().clone()
            try:
                self._digest = self._digest or weights_digest(self.module)
                shared = (self._digest, *key)
                fn = _SHARED_TRACES.get(shared)
                if fn is None:
                    fn = torch.jit.freeze(torch.jit.trace(self.module, sample))
                diff = float((fn(sample).float() - self.module(sample).float()).abs().max())
            except Exception as err:  # noqa: BLE001 - any tracer failure means: stay eager
                return self._give_up(f"{type(err).__name__}: {err}")
        if not diff <= MAX_ABS_DIFF:
            return self._give_up(f"traced output differs from eager by {diff:.2e}")
        self._traces[key] = _SHARED_TRACES[shared] = fn
        return fn

    def _give_up(self, reason: str) -> None:
        self.eager_only = True
        self.reason = reason
        log.warning("vision backbone stays eager (trace unusable: %s)", reason[:300])
        return None
