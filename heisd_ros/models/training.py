"""Training loops: the VLA on demonstrations, and the EAGLE drafter on the VLA's own features.

Both teacher-force the 7 action tokens behind the OpenVLA prompt. The VLA learns cross-entropy
over the 256 action bins; the drafter learns SmoothL1 feature regression plus 0.1 x token
cross-entropy against the VLA's own greedy tokens (Spec-VLA/EAGLE recipe), with feature noise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from heisd_ros.core.drafter import EagleDrafter
from heisd_ros.core.types import ACTION_DIM


@dataclass
class Example:
    images: list[np.ndarray]  # one uint8 [H, W, 3] per view, primary first
    instruction: str
    tokens: np.ndarray  # [7] action token ids


def _batches(examples: Sequence[Example], batch_size: int, steps: int, seed: int):
    """Random batches that share one instruction (so prompt lengths agree)."""
    by_instruction: dict[str, list[Example]] = {}
    for ex in examples:
        by_instruction.setdefault(ex.instruction, []).append(ex)
    groups = list(by_instruction.values())
    weights = [len(g) for g in groups]
    rng = random.Random(seed)
    for _ in range(steps):
        group = rng.choices(groups, weights)[0]
        yield rng.sample(group, min(batch_size, len(group)))


def teacher_forced(vla, batch: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Run prompt + action tokens causally. Returns (hidden [B, P+7, D], input embeds [B, P+7, D], P)."""
    pixels = vla.preprocess([ex.images[0] for ex in batch])
    visual = vla.projector(vla.vision_backbone(pixels))  # [B, N, D]
    prompts = torch.stack([vla.prompt_embeds(ex.instruction, visual[i])[0] for i, ex in enumerate(batch)])
    tokens = torch.tensor(np.stack([ex.tokens for ex in batch]), device=vla.device)
    embeds = torch.cat([prompts, vla.get_input_embeddings()(tokens)], dim=1)
    hidden = vla.language_model.model(inputs_embeds=embeds).last_hidden_state
    return hidden, embeds, prompts.shape[1]


def action_logits(vla, hidden_at_action_positions: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [..., 256] logits; column j is token first_token_id + j."""
    return hidden_at_action_positions @ vla.action_head_weight().T


def train_vla(
    vla, examples: Sequence[Example], steps: int, batch_size: int = 16, lr: float = 1e-3, seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Cross-entropy on the 7 action tokens; returns the loss curve."""
    torch.manual_seed(seed)
    vla.train()
    opt = torch.optim.AdamW([p for p in vla.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    first = vla.action_tokenizer.first_token_id
    losses = []
    for i, batch in enumerate(_batches(examples, batch_size, steps, seed)):
        hidden, _, p = teacher_forced(vla, batch)
        logits = action_logits(vla, hidden[:, p - 1 : p - 1 + ACTION_DIM])
        target = torch.tensor(np.stack([ex.tokens for ex in batch]), device=logits.device) - first
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256).float(), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(vla.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress:
            progress(i, losses[-1])
    vla.eval()
    return losses


def greedy_tokens(vla, examples: Sequence[Example]) -> list[Example]:
    """Replace each example's tokens by the VLA's own greedy action tokens (teacher-forced scan)."""
    out = []
    with torch.inference_mode():
        for ex in examples:
            pixels = vla.preprocess([ex.images[0]])
            prompt = vla.prompt_embeds(ex.instruction, vla.projector(vla.vision_backbone(pixels))[0])
            tokens: list[int] = []
            embeds = prompt
            for _ in range(ACTION_DIM):  # plain AR without cache: simple, only used offline
                h = vla.language_model.model(inputs_embeds=embeds).last_hidden_state[0, -1]
                tok = vla.action_tokenizer.first_token_id + int(action_logits(vla, h).argmax())
                tokens.append(tok)
                embeds = torch.cat([embeds, vla.get_input_embeddings()(torch.tensor([[tok]], device=vla.device))], 1)
            out.append(Example(ex.images, ex.instruction, np.array(tokens)))
    return out


def train_drafter(
    vla, examples: Sequence[Example], steps: int, batch_size: int = 16, lr: float = 3e-3, seed: int = 0,
    feature_noise: float = 0.05, progress: Callable[[int, float], None] | None = None,
) -> tuple[EagleDrafter, list[float]]:
    """Train an EagleDrafter on the VLA's features. `examples` should carry the VLA's own greedy tokens."""
    torch.manual_seed(seed)
    drafter = EagleDrafter(vla.language_model.config).to(vla.dtype)
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    losses = []
    for i, batch in enumerate(_batches(examples, batch_size, steps, seed)):
        with torch.no_grad():
            hidden, embeds, p = teacher_forced(vla, batch)
            target_logits = action_logits(vla, hidden[:, 1:])
        feats = hidden[:, :-1] + feature_noise * torch.randn_like(hidden[:, :-1]) * hidden.std()
        pred = drafter(feats, embeds[:, 1:])  # [B, P+6, D] ~ hidden[:, 1:]
        reg = nn.functional.smooth_l1_loss(pred, hidden[:, 1:])
        # Token loss where drafts are made: predictions of a2..a7 (features at a1..a6).
        sl = slice(p - 1, p - 1 + ACTION_DIM - 1)
        logits = action_logits(vla, pred[:, sl]).float()
        ce = nn.functional.cross_entropy(logits.reshape(-1, 256), target_logits[:, sl].argmax(-1).reshape(-1))
        loss = reg + 0.1 * ce
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress:
            progress(i, losses[-1])
    drafter.eval()
    return drafter, losses
