"""One LLM forward over `chain + draft tree` on top of a KV cache, and cache compaction.

Every forward of the target model goes through `TargetSession.forward`:

    input  = chain (L tokens, causal: the prompt in a prefill, or the single pending token)
             + tree (N draft nodes, each attending to the cache, the chain and its ancestors)
    output = final hidden states (the lm_head inputs) and the argmax *bin* at each position

Only the 256 action rows of the lm_head are evaluated (decoding is constrained to action tokens
in every method, so AR and speculative paths agree by construction), and only at the positions
whose predictions are used: the chain's last position and the tree nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from heisd_ros.core.tree import DraftTree


@dataclass
class ForwardResult:
    hidden: torch.Tensor
    """[1 + N, D]: lm_head inputs at the chain's last position, then at each tree node."""
    bins: torch.Tensor
    """[1 + N] int64: the target's argmax bin predicted at those positions."""
    chain_hidden: torch.Tensor | None = None
    """[L, D]: lm_head inputs at every chain position (the drafter's features)."""


def build_attention(
    past: int, chain: int, tree: DraftTree | None, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive mask [1, 1, L+N, past+L+N] and position ids [1, L+N] for a chain + tree forward.

    Tree node positions are `past + chain - 1 + depth`, so siblings share a position, exactly as
    if each root-to-node path had been decoded alone.
    """
    n = len(tree) if tree is not None else 0
    total = past + chain + n
    allowed = torch.zeros(chain + n, total, dtype=torch.bool, device=device)
    allowed[:, :past] = True
    allowed[:chain, past : past + chain] = torch.tril(torch.ones(chain, chain, dtype=torch.bool, device=device))
    positions = torch.arange(past, past + chain, device=device)
    if n:
        allowed[chain:, past : past + chain] = True
        allowed[chain:, past + chain :] = torch.from_numpy(tree.ancestor_mask()).to(device)
        depths = torch.tensor(tree.depths, device=device)
        positions = torch.cat([positions, past + chain - 1 + depths])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None], positions[None]


def llama_forward(model, inputs_embeds: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, cache) -> torch.Tensor:
    """`LlamaModel.forward` for a ready-made 4-D mask: the model's own rotary embedding, decoder
    layers and final norm, without the per-call wrappers (output capture, config merging,
    mask construction) that cost ~1 ms per call on CPU, more than a tiny model's layers.

    inputs_embeds [1, T, D] -> final hidden states [1, T, D]; the cache grows by T.
    """
    position_embeddings = model.rotary_emb(inputs_embeds, position_ids=position_ids)
    hidden = inputs_embeds
    for layer in model.layers:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                       position_ids=position_ids, cache=cache, use_cache=True)
    return model.norm(hidden)


@torch.inference_mode()
def compact_cache(cache, keep: int, extra: list[int]) -> None:
    """Keep cache positions [0, keep) plus `extra` (absolute positions, ascending), in place.

    `extra[i]` lands at `keep + i`. An accepted path's leading nodes are usually there already
    (a chain, or the tree's first branch), so only the tail after them is copied; the rest is a
    view of the first `keep + len(extra)` positions. The whole cache is never rewritten.
    """
    end = keep + len(extra)
    moved = next((i for i, p in enumerate(extra) if p != keep + i), len(extra))
    if moved < len(extra):
        src, dst = extra[moved:], slice(keep + moved, end)
        contiguous = src[-1] - src[0] == len(src) - 1
        overlaps = src[0] < end  # then the source is copied out before it is overwritten
        index = None if contiguous else torch.tensor(src, device=cache.layers[0].keys.device)
        for layer in cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                if contiguous:
                    part = t[:, :, src[0] : src[-1] + 1]
                    t[:, :, dst] = part.clone() if overlaps else part
                else:
                    t[:, :, dst] = t.index_select(2, index)
    for layer in cache.layers:
        if layer.keys.shape[2] > end:
            layer.keys = layer.keys[:, :, :end]
            layer.values = layer.values[:, :, :end]


def _start_clock(device: torch.device) -> float | torch.cuda.Event:
    if device.type != "cuda":
        return time.perf_counter()
    start = torch.cuda.Event(enable_timing=True)
    start.record(torch.cuda.current_stream(device))
    return start


def _stop_clock(start: float | torch.cuda.Event, device: torch.device) -> float | tuple:
    if isinstance(start, float):
        return (time.perf_counter() - start) * 1e3
    end = torch.cuda.Event(enable_timing=True)
    end.record(torch.cuda.current_stream(device))
    return start, end


def _elapsed_ms(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
    end.synchronize()  # already complete when the step's tokens are on the host
    return start.elapsed_time(end)


class TargetSession:
    """The target LLM's KV cache for one control step; `length` = positions committed so far."""

    def __init__(self, language_model, head_weight: torch.Tensor, logit_bias: torch.Tensor | None = None) -> None:
        from transformers import DynamicCache

        self.lm = language_model
        self.head_weight = head_weight  # [256, D]; column j of the logits is bin 256 - j
        self.logit_bias = logit_bias
        """[7, 256] added to the action logits predicting action index i (row i), in column order:
        the state prior (`core.model_api.ActionPrior`), fixed for the step. Every method decodes
        through this one argmax, so the bias changes the policy, never the SD/AR agreement."""
        self.embed = language_model.get_input_embeddings()
        self.cache = DynamicCache(config=language_model.config)
        self.length = 0
        self.forwards = 0
        self._clocks: list[float | tuple] = []
        """Per forward: its wall time in ms, or on CUDA a (start, end) pair of events (`forward_ms`)."""

    @property
    def forward_ms(self) -> list[float]:
        """Time of each forward so far, ms.

        On CUDA it is the device time between two events recorded in the stream around the
        forward, read only when asked (at the end of a step, once its tokens reached the host):
        a host clock would need a `synchronize` after every forward, which stalls the launch
        queue between forwards."""
        return [c if isinstance(c, float) else _elapsed_ms(*c) for c in self._clocks]

    def token_embeds(self, tokens: list[int]) -> torch.Tensor:
        """[len(tokens), D] input embeddings."""
        return self.embed(torch.tensor(tokens, device=self.head_weight.device))

    @torch.inference_mode()
    def forward(self, chain_embeds: torch.Tensor, tree: DraftTree | None = None, action_index: int = 0) -> ForwardResult:
        """chain_embeds [L, D] (+ tree) through the LLM; the cache grows by L + N (see `commit`).

        action_index: which action dimension the chain's last position predicts (tree node at
        depth d predicts action_index + d); read only where a logit bias is set."""
        clock = _start_clock(chain_embeds.device)
        chain = chain_embeds.shape[0]
        embeds = chain_embeds
        if tree is not None and len(tree):
            embeds = torch.cat([chain_embeds, self.token_embeds(tree.tokens)])
        mask, positions = build_attention(self.length, chain, tree, embeds.dtype, embeds.device)
        last = llama_forward(self.lm.model, embeds[None], mask, positions, self.cache)[0]
        self.forwards += 1
        self._pending = chain
        hidden = last[chain - 1 :]
        logits = hidden @ self.head_weight.T
        if self.logit_bias is not None:
            depths = torch.tensor([0] + (list(tree.depths) if tree is not None else []), device=logits.device)
            rows = (action_index + depths).clamp(max=self.logit_bias.shape[0] - 1)
            logits = logits.float() + self.logit_bias.to(logits.device)[rows]
        bins = 256 - logits.argmax(dim=-1)
        self._clocks.append(_stop_clock(clock, bins.device))
        return ForwardResult(hidden=hidden, bins=bins, chain_hidden=last[:chain])

    def commit(self, accepted_nodes: list[int]) -> None:
        """Keep the last forward's chain and its accepted tree nodes (in path order) in the cache."""
        keep = self.length + self._pending
        compact_cache(self.cache, keep, [keep + n for n in accepted_nodes])
        self.length = keep + len(accepted_nodes)
