"""The drafter's block for inference: fused weights, its own KV buffer, few ops a call.

Drafting calls the drafter once per tree depth on one or two rows. On a CPU such a call costs its
op count (tens of microseconds of dispatch each), not its arithmetic: through transformers'
`LlamaDecoderLayer` and `DynamicCache` one call is about sixty ops and their Python wrappers. Here
the same arithmetic is about twenty-five ops: q, k and v in one product and gate and up in another
(weights concatenated once), the rotary tables computed once by the block's own rotary embedding,
torch's fused RMSNorm, and one SDPA over grouped KV heads with a boolean mask.

The outputs equal the transformers block's within float rounding (test/core/test_drafter_block.py).
A strict method's tokens never depend on the drafter's numerics (the verifier decides every
token); only how many drafts it accepts does.

`FusedDrafterBlock` concatenates the drafter's q/k/v and gate/up weights when it is made: a
drafter trained further afterwards needs a new block (`HybridDecoder` makes one per decoder).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from heisd_ros.core import onednn

_MIN_CAPACITY = 64
"""Positions a new cache holds before it first grows (a mini-VLA step uses about 50)."""


class DrafterCache:
    """The drafter's keys and values for one control step.

    Buffers [1, KV heads, capacity, head dim]; positions [0, length) are in use. Tree expansion
    appends temporary positions and `crop`s them away afterwards."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int = _MIN_CAPACITY) -> None:
        self.keys = torch.empty(1, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values [KV, T, head dim] -> every position's keys and values [1, KV, length, head dim]."""
        end = self.length + keys.shape[1]
        if end > self.keys.shape[2]:
            self._grow(end)
        self.keys[0, :, self.length : end] = keys
        self.values[0, :, self.length : end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.keys.shape[2])
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], capacity, old.shape[3])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)


class _Product:
    """x [R, in] @ weight.T: on oneDNN's packed copy of the weight from `min_rows` rows on; torch's
    kernel for fewer rows and everywhere when `min_rows` is None (no packed copy)."""

    def __init__(self, weight: torch.Tensor, min_rows: int | None) -> None:
        self.weight = weight
        self.min_rows = min_rows
        self.packed = onednn.pack(weight) if min_rows is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.shape[0] < self.min_rows:
            return F.linear(x, self.weight)
        return onednn.linear(x, self.packed)


class FusedDrafterBlock:
    """`EagleDrafter`'s inference forward (fc, one LLaMA decoder layer, final norm) on fused weights.

    `linear_kernel` 'onednn' (the decoder's `llm_linear`) runs the products of several rows on
    oneDNN-packed copies of the weights where they are float32 on the CPU and hold at most
    `onednn.MAX_PACKED_BYTES`; 'auto' does so from the row count on which that is measured faster
    on this machine (`onednn.packed_min_rows`); 'torch' keeps torch's kernel."""

    def __init__(self, drafter: nn.Module, linear_kernel: str = "torch") -> None:
        """drafter: a `core.drafter.EagleDrafter` (its `fc`, `block` and `config`)."""
        cfg = drafter.config
        layers = drafter.block.layers
        if len(layers) != 1:
            raise ValueError(f"the drafter has {len(layers)} decoder layers; its fused block runs exactly one")
        layer = layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        if cfg.attention_bias or cfg.mlp_bias or cfg.hidden_act != "silu":
            raise ValueError("the fused drafter block runs LLaMA layers without biases and with SiLU")
        # q/k/v and gate/up are concatenated once (a copy of those weights: the price of two
        # products instead of five); the other weights are the drafter's own tensors
        with torch.no_grad():
            weights = {"fc": drafter.fc.weight,
                       "qkv": torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                       "o": attn.o_proj.weight,
                       "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                       "down": mlp.down_proj.weight}
        weights = {name: w.detach() for name, w in weights.items()}
        size = sum(w.numel() * w.element_size() for w in weights.values())
        min_rows = onednn.min_rows_for(linear_kernel, list(weights.values())) if size <= onednn.MAX_PACKED_BYTES else None
        self.fc, self.qkv, self.o, self.gate_up, self.down = (_Product(w, min_rows) for w in weights.values())
        self.norm_in = layer.input_layernorm.weight.detach()
        self.norm_post = layer.post_attention_layernorm.weight.detach()
        self.norm_out = drafter.block.norm.weight.detach()
        with torch.no_grad():
            self.cos, self.sin = self._rope_tables(drafter, cfg.max_position_embeddings)
        self.eps = (layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon,
                    drafter.block.norm.variance_epsilon)
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim
        self.hidden = cfg.hidden_size
        self.scale = attn.scaling

    @staticmethod
    def _rope_tables(drafter: nn.Module, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [positions, head dim] from the block's own rotary embedding (its rope type)."""
        weight = drafter.fc.weight
        ids = torch.arange(positions, device=weight.device)[None]
        cos, sin = drafter.block.rotary_emb(weight[:1, None], position_ids=ids)
        return cos[0].to(weight.dtype), sin[0].to(weight.dtype)

    @property
    def packed(self) -> bool:
        """Whether products of enough rows (`min_rows`) run on oneDNN-packed weights."""
        return self.fc.packed is not None

    def new_cache(self) -> DrafterCache:
        return DrafterCache(self.kv_heads, self.head_dim, self.fc.weight.dtype, self.fc.weight.device)

    def __call__(self, features: torch.Tensor, token_embeds: torch.Tensor, positions: torch.Tensor,
                 visible: torch.Tensor, cache: DrafterCache) -> torch.Tensor:
        """features, token_embeds [T, D]; positions [T] int64 (rotary positions); visible [T,
        cache.length + T] bool: which cached and new positions each row attends to. The T new
        positions are appended to the cache. Returns the predicted next features [T, D]."""
        if int(positions.max()) >= self.cos.shape[0]:
            raise ValueError(f"drafter position {int(positions.max())} is beyond the model's "
                             f"{self.cos.shape[0]} positions")
        t, h, kv, hd = features.shape[0], self.heads, self.kv_heads, self.head_dim
        x = self.fc(torch.cat([token_embeds, features], dim=-1))
        qkv = self.qkv(F.rms_norm(x, (self.hidden,), self.norm_in, self.eps[0])).view(t, h + 2 * kv, hd)
        qk = qkv[:, : h + kv]
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        half = hd // 2
        qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], dim=-1) * sin  # rotate_half
        keys, values = cache.append(qk[:, h:].transpose(0, 1), qkv[:, h + kv :].transpose(0, 1))
        attn = F.scaled_dot_product_attention(qk[:, :h].transpose(0, 1)[None], keys, values, attn_mask=visible,
                                              scale=self.scale, enable_gqa=kv != h)
        x = x + self.o(attn[0].transpose(0, 1).reshape(t, h * hd))
        gate, up = self.gate_up(F.rms_norm(x, (self.hidden,), self.norm_post, self.eps[1])).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return F.rms_norm(x, (self.hidden,), self.norm_out, self.eps[2])


def causal_visibility(past: int, new: int, device: torch.device) -> torch.Tensor:
    """[new, past + new] bool: every cached position, and the new positions up to each row's own."""
    return torch.ones(new, past + new, dtype=torch.bool, device=device).tril(diagonal=past)
