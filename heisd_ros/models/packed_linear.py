"""The LLM's linear layers on oneDNN with weights packed once at load (CPU, float32).

A speculative step's verification forward carries several tokens (the prompt and a fused draft
tree, or the pending token and the drafter's tree). oneDNN, with the weight packed once in its
blocked layout, does those products in about two thirds of the time torch's own CPU linear takes
at 2-48 rows; a one-row decode (ar's) is not faster on it (a 6-layer decode forward 6.4 against
6.0 ms), so one row keeps torch's kernel (`python benchmarks/linear_kernel.py` measures the steps).
The outputs equal torch's within float rounding; `decoder.llm_linear` 'torch' keeps torch's kernel
for every row count. The cost: the packed copy beside the dense weights (the decoder layers'
weight bytes once more; 38 MB for the mini VLA).

This is how the model is loaded (`ModelSpec.llm_linear`), not a decoder's state: every decoder over
one loaded model runs the same kernel, as every method of a run must.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from heisd_ros.core import onednn

log = logging.getLogger(__name__)

LLM_LINEARS = onednn.KERNELS
MAX_PACKED_BYTES = onednn.MAX_PACKED_BYTES


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (x86 builds with MKL-DNN)."""
    return onednn.available()


class PackedLinear(nn.Module):
    """An nn.Linear whose multi-row inference runs on a oneDNN-packed copy of its weight.

    The dense weight and bias stay (the same tensors, so state_dict and every reader are
    unchanged); one row, anything autograd needs (training) and a weight moved off float32 on the
    CPU run on them. The packed copy is not module state (`.to()` leaves it) and is rebuilt when
    the weight is written in place.
    """

    def __init__(self, linear: nn.Linear, min_rows: int = onednn.MIN_ROWS) -> None:
        super().__init__()
        self.min_rows = min_rows  # fewer rows run on torch's kernel (`onednn.packed_min_rows`)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._packed, self._packed_version = self._pack()

    def _pack(self) -> tuple[torch.Tensor, int]:
        return onednn.pack(self.weight), self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        w = self.weight
        if (rows.shape[0] < self.min_rows or w.dtype != torch.float32 or w.device.type != "cpu" or x.dtype != torch.float32
                or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return nn.functional.linear(x, w, self.bias)
        if w._version != self._packed_version:
            self._packed, self._packed_version = self._pack()
        bias = None if self.bias is None else self.bias.detach()
        out = onednn.linear(rows, self._packed, bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"onednn from {self.min_rows} rows")


def pack_decoder_layers(language_model: nn.Module, device: str, dtype: str, kernel: str = "onednn") -> int:
    """Replace every nn.Linear in the LLM's decoder layers (`language_model.model.layers`) with a
    PackedLinear; returns how many. Only float32 on the CPU; elsewhere (GPU, bf16, a build without
    oneDNN) nothing changes and 0 is returned. `kernel` 'auto' packs only where oneDNN is measured
    faster than torch's kernel on one decoder layer's weights, and from the row count on where it
    is (`onednn.packed_min_rows`). The lm_head is left alone: decoding reads only its 256 action
    rows, as a plain matrix."""
    if torch.device(device).type != "cpu" or dtype != "float32":
        return 0
    if not onednn_linear_available():
        log.warning("llm_linear 'onednn': this torch build has no oneDNN linear; the LLM runs torch's own")
        return 0
    targets = [(parent, name, child) for layer in language_model.model.layers for parent in layer.modules()
               for name, child in parent.named_children() if type(child) is nn.Linear]
    size = sum(child.weight.numel() * child.weight.element_size() for _, _, child in targets)
    if size > MAX_PACKED_BYTES:
        log.info("llm_linear 'onednn': the decoder layers hold %.1f GB, over the %.1f GB a packed copy may add; "
                 "the LLM runs torch's kernel", size / 1e9, MAX_PACKED_BYTES / 1e9)
        return 0
    first_layer = [child.weight for parent in language_model.model.layers[0].modules()
                   for child in parent.children() if type(child) is nn.Linear]
    min_rows = onednn.min_rows_for(kernel, first_layer)
    if min_rows is None:
        return 0
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child, min_rows))
    return len(targets)
