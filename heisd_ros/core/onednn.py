"""oneDNN's linear product on a weight packed once into its blocked layout (x86 CPU, float32).

A product of a few to a few dozen rows (a verification forward, a drafter call over a tree's
frontier or a prompt) took about two thirds of torch's own CPU linear on the packed weight on an
AMD EPYC, and a single row does not gain; on an Intel Xeon with AVX-512 torch's own was the faster
(`benchmarks/linear_kernel.py`). Which one wins depends on the processor, so the kernel 'auto'
(`packed_min_rows`) times both on the weights at hand once per process. Used by the LLM's decoder
layers (`models/packed_linear.py`) and by the drafter's fused block (`core/drafter_block.py`).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ROWS_HINT = 16
"""The batch size oneDNN blocks a packed weight for (a verification forward's rows)."""
MAX_PACKED_BYTES = 2 << 30
"""Above this many bytes of weights a model's packed copy is not made (a 7B LLM in float32 on a
CPU would need 26 GB more): such a model keeps torch's kernel, with an info line saying so."""


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear (x86 builds with MKL-DNN)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packable(weight: torch.Tensor) -> bool:
    """Whether `weight` can be packed: float32 on the CPU, in a build with oneDNN's linear."""
    return weight.dtype == torch.float32 and weight.device.type == "cpu" and available()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] (float32, CPU) -> its packed copy for `linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


def linear(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """rows [R, in] (float32, CPU) @ packed.T (+ bias) -> [R, out]."""
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


KERNELS = ("auto", "onednn", "torch")
"""`decoder.llm_linear`: 'auto' packs where oneDNN is measured faster on this machine."""
MIN_ROWS = 2
"""The fewest rows a product runs packed with `llm_linear` 'onednn' (one row is never faster)."""
AUTO_ROWS = (2, 8, 32)
"""The row counts 'auto' times: a drafter call on a tree's frontier, a verification forward, a prompt."""
AUTO_MARGIN = 0.8
"""'auto' packs a row count only where oneDNN takes under this share of torch's time in isolation.
In the decode loop the packed copy shares the caches with the dense weights that one-row products
read, and on an Intel Xeon products 5-13 % faster alone made the steps slower (a drafter step
72.4 ms packed from 2 rows, 68.3 from 8 and 32, 66.7 on torch's kernel); on an AMD EPYC packing
took about two thirds of torch's time and won end to end."""
_decisions: dict[tuple, dict] = {}


def packed_min_rows(weights: list[torch.Tensor], repeats: int = 15) -> int | None:
    """The fewest rows from which products with `weights` (float32, CPU) are faster on their packed
    copies than on torch's kernel on this machine, or None where no row count of `AUTO_ROWS` gains
    (keep torch's kernel). Timed once per process and set of shapes at each row count (the kernels
    taking turns, the median of each); a count qualifies only with every larger one. About a
    hundred milliseconds for a small model's layer. A speed choice only: both kernels give the
    same products within float rounding."""
    if not weights or not all(packable(w) for w in weights):
        return None
    key = tuple(tuple(w.shape) for w in weights)
    if key not in _decisions:
        packed = [pack(w) for w in weights]
        timings = {}
        with torch.inference_mode():
            for rows in AUTO_ROWS:
                xs = [torch.randn(rows, w.shape[1]) for w in weights]
                t_torch, t_onednn = [], []
                for i in range(repeats + 2):  # the first two warm both kernels up
                    t0 = time.perf_counter()
                    for x, w in zip(xs, weights):
                        F.linear(x, w)
                    t1 = time.perf_counter()
                    for x, pw in zip(xs, packed):
                        linear(x, pw)
                    t2 = time.perf_counter()
                    if i >= 2:
                        t_torch.append(t1 - t0)
                        t_onednn.append(t2 - t1)
                timings[rows] = (1e6 * sorted(t_torch)[repeats // 2], 1e6 * sorted(t_onednn)[repeats // 2])
        min_rows = None
        for rows in sorted(AUTO_ROWS, reverse=True):
            torch_us, onednn_us = timings[rows]
            if onednn_us >= AUTO_MARGIN * torch_us:
                break
            min_rows = rows
        _decisions[key] = {"weights": len(weights), "min_rows": min_rows,
                           "us_torch_onednn": {r: [round(a, 1), round(b, 1)] for r, (a, b) in timings.items()}}
        log.info("linear kernel 'auto' on %d weights: us (torch, oneDNN) by rows %s -> %s", len(weights),
                 _decisions[key]["us_torch_onednn"],
                 f"packed from {min_rows} rows" if min_rows else "torch's kernel")
    return _decisions[key]["min_rows"]


def min_rows_for(kernel: str, weights: list[torch.Tensor]) -> int | None:
    """The fewest rows a product with `weights` runs packed under `llm_linear` `kernel` (None: never)."""
    if kernel == "onednn":
        return MIN_ROWS if weights and all(packable(w) for w in weights) else None
    if kernel == "auto":
        return packed_min_rows(weights)
    return None


def decisions() -> list[dict]:
    """The choices 'auto' made in this process, with their timings (a run's log records them)."""
    return [dict(d) for d in _decisions.values()]
