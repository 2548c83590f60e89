"""EAGLE-style drafter head and EAGLE-2 dynamic draft-tree expansion.

The head is one LLaMA decoder block fed by fc([token embedding ; target feature]); its output
approximates the target's next feature, and the *target's* lm_head (action rows) turns it into
draft logits. For committed position i the input pair is (f_i, e(x_{i+1})): the target's lm_head
input at i and the embedding of the token that follows it. The head keeps its own KV cache of
committed pairs; tree expansion adds temporary entries that are cropped afterwards.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from heisd_ros.core.config import DrafterTreeConfig
from heisd_ros.core.drafter_block import FusedDrafterBlock, causal_visibility
from heisd_ros.core.errors import ModelLoadError
from heisd_ros.core.tree import DraftTree


class EagleDrafter(nn.Module):
    """fc(2D -> D) + one LLaMA decoder block (+ final RMSNorm, matching the target's features)."""

    def __init__(self, llm_config) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        cfg = llm_config.to_dict()
        cfg.update(num_hidden_layers=1, vocab_size=1, bos_token_id=None, eos_token_id=None, pad_token_id=None)  # inputs are always embeddings
        cfg.pop("architectures", None)
        self.config = LlamaConfig(**cfg)
        hidden = self.config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = LlamaModel(self.config)

    def fuse(self, features: torch.Tensor, token_embeds: torch.Tensor) -> torch.Tensor:
        """features, token_embeds [T, D] -> block inputs [T, D]."""
        return self.fc(torch.cat([token_embeds, features], dim=-1))

    def forward(self, features, token_embeds, attention_mask=None, position_ids=None):
        """Predicted next features [B, T, D], causal over whole sequences (training, and the
        reference the inference block is tested against: `core.drafter_block`)."""
        x = self.fuse(features, token_embeds)
        x = x[None] if x.dim() == 2 else x
        return self.block(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state

    def save(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "drafter_config.json").write_text(json.dumps({"model_type": "heisd_eagle_drafter", "llm": self.config.to_dict()}))
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(d / "drafter.safetensors"))


def load_drafter(directory: str | Path, target_config, dtype: torch.dtype = torch.float32) -> EagleDrafter:
    """Load a drafter saved by `EagleDrafter.save`; its hidden size must match the target's."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    weights = d / "drafter.safetensors"
    if not weights.is_file():
        raise ModelLoadError(f"missing drafter weights {weights}")
    drafter = EagleDrafter(target_config)
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise ModelLoadError(f"corrupt drafter weights {weights}: {err}") from err
    expected = drafter.state_dict()
    bad = [k for k, v in state.items() if k in expected and expected[k].shape != v.shape]
    if bad or set(state) != set(expected):
        raise ModelLoadError(f"{weights} does not match the target model (hidden {target_config.hidden_size}): {bad[:3] or sorted(set(state) ^ set(expected))[:3]}")
    drafter.load_state_dict(state)
    return drafter.to(dtype).eval()


@dataclass
class _Node:
    token: int
    parent: int  # index into the node list, -1 = root
    score: float  # cumulative log-probability
    cache_slot: int = -1  # position of this node's pair in the temporary drafter cache


class DrafterSession:
    """The drafter's KV cache for one control step, and EAGLE-2 tree expansion."""

    def __init__(self, block: FusedDrafterBlock, target_embed: nn.Embedding, head_weight: torch.Tensor,
                 first_token_id: int, logit_bias: torch.Tensor | None = None) -> None:
        self.block = block
        self.embed_weight = target_embed.weight
        self.head_weight = head_weight
        self.first_token_id = first_token_id
        """Token id of head_weight's row 0 (the VLA's `action_tokenizer.first_token_id`): the
        embedding may have more rows than the vocabulary (OpenVLA pads 32000 to 32064), so it
        cannot be read off the embedding's size."""
        self.logit_bias = logit_bias
        """[7, 256]: the verifier's per-action-index bias (`TargetSession.logit_bias`), added here
        too so the drafter proposes what the verifier will pick."""
        self.cache = block.new_cache()

    @property
    def length(self) -> int:
        """Committed pairs in the cache."""
        return self.cache.length

    @torch.inference_mode()
    def extend(self, features: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """Commit pairs (f_i, e_{i+1}) for the next positions: features, next_embeds [T, D].

        The last pair is the pending token's (its feature produced the token); the returned
        drafter output for it [D] is the root of the next draft tree.
        """
        t, past = features.shape[0], self.cache.length
        positions = torch.arange(past, past + t, device=features.device)
        out = self.block(features, next_embeds, positions, causal_visibility(past, t, features.device), self.cache)
        return out[-1]

    @torch.inference_mode()
    def expand(self, root_hidden: torch.Tensor, depth: int, cfg: DrafterTreeConfig, action_index: int = 0) -> DraftTree:
        """EAGLE-2 dynamic tree below the pending token, whose pair was the last one committed.

        root_hidden [D]: the drafter's output for that pair (`extend`'s return value). Each depth
        expands the `top_k` best frontier nodes by cumulative log-probability into their `top_k`
        best children; finally the `total_tokens` best nodes overall are kept (a child never
        outscores its parent, so kept nodes' ancestors are kept too). Temporary cache entries of
        expanded nodes are dropped at the end. `action_index`: the action dimension of the root's
        children (read only where a logit bias is set).
        """
        base = self.cache.length
        nodes: list[_Node] = []
        hidden_of: dict[int, torch.Tensor] = {-1: root_hidden}  # drafter output per expanded node
        frontier = self._children(root_hidden[None], [-1], [0.0], cfg.top_k, nodes, action_index)
        slot = base
        min_score = math.log(cfg.min_path_prob) if cfg.min_path_prob > 0 else -math.inf
        for level in range(1, depth):
            frontier = sorted(frontier, key=lambda i: -nodes[i].score)[: cfg.top_k]
            if nodes[frontier[0]].score < min_score:
                break
            for row, i in enumerate(frontier):  # frontier nodes attend to their expanded ancestors
                nodes[i].cache_slot = slot + row
            slot += len(frontier)
            tokens = torch.tensor([nodes[i].token for i in frontier], device=root_hidden.device)
            parents = torch.stack([hidden_of[nodes[i].parent] for i in frontier])
            out = self._run(parents, F.embedding(tokens, self.embed_weight),
                            [self._ancestor_slots(nodes, i) for i in frontier], base)
            for row, i in enumerate(frontier):
                hidden_of[i] = out[row]
            frontier = self._children(out, frontier, [nodes[i].score for i in frontier], cfg.top_k, nodes,
                                      action_index + level)
        self.cache.crop(base)
        keep = sorted(range(len(nodes)), key=lambda i: -nodes[i].score)[: cfg.total_tokens]
        return _to_tree(nodes, set(keep))

    def _children(self, hidden: torch.Tensor, parents: list[int], scores: list[float], k: int, nodes: list[_Node],
                  action_index: int = 0) -> list[int]:
        """Top-k children of each row of hidden [R, D] (one batched head + top-k for all rows)."""
        logits = (hidden @ self.head_weight.T).float()
        if self.logit_bias is not None:
            logits = logits + self.logit_bias[min(action_index, self.logit_bias.shape[0] - 1)].to(logits.device)
        logp = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logp, k, dim=-1)
        out = []
        for parent, score, lps, idx in zip(parents, scores, top.values.tolist(), top.indices.tolist()):
            for lp, j in zip(lps, idx):
                nodes.append(_Node(token=self.first_token_id + j, parent=parent, score=score + lp))
                out.append(len(nodes) - 1)
        return out

    def _ancestor_slots(self, nodes: list[_Node], i: int) -> list[int]:
        """Temporary-cache slots of node i's expanded ancestors and of i itself, root side first."""
        slots, p = [nodes[i].cache_slot], nodes[i].parent
        while p >= 0:
            slots.append(nodes[p].cache_slot)
            p = nodes[p].parent
        return slots[::-1]

    def _run(self, features, token_embeds, visible_slots: list[list[int]], base: int) -> torch.Tensor:
        """Drafter forward for tree nodes: each row sees the committed cache [0, base) and its slots."""
        t, past = features.shape[0], self.cache.length
        visible = np.zeros((t, past + t), dtype=bool)
        visible[:, :base] = True
        for row, slots in enumerate(visible_slots):
            visible[row, slots] = True
        # A node at depth d sits at position base - 1 + d (the root is the last committed position).
        positions = torch.tensor([base - 1 + len(s) for s in visible_slots], device=features.device)
        return self.block(features, token_embeds, positions, torch.from_numpy(visible).to(features.device), self.cache)


def _to_tree(nodes: list[_Node], keep: set[int]) -> DraftTree:
    tree = DraftTree()
    index: dict[int, int] = {}
    for i, node in enumerate(nodes):  # nodes are created parent-first
        if i in keep and (node.parent < 0 or node.parent in index):
            index[i] = tree.add(node.token, index[node.parent] if node.parent >= 0 else -1)
    return tree
