"""oneDNN's linear product on a weight packed once into its blocked layout (x86 CPU, float32).

A product of a few to a few dozen rows (a verification forward, a drafter call over a tree's
frontier or a prompt) takes about two thirds of torch's own CPU linear on the packed weight; a
single row does not gain (`benchmarks/linear_kernel.py`). Used by the LLM's decoder layers
(`models/packed_linear.py`) and by the drafter's fused block (`core/drafter_block.py`).
"""

from __future__ import annotations

import torch

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
