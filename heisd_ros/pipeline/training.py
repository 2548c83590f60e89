"""Training loops: the VLA on demonstrations, and the EAGLE drafter on the VLA's own features.

Both teacher-force the 7 action tokens behind the OpenVLA prompt. The VLA learns cross-entropy
over the 256 action bins; the drafter learns SmoothL1 feature regression plus 0.1 x token
cross-entropy against the VLA's own greedy tokens (Spec-VLA/EAGLE recipe), with feature noise.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from heisd_ros.core.drafter import EagleDrafter
from heisd_ros.core.model_api import ActionPrior
from heisd_ros.core.types import ACTION_DIM

BACKBONE_LR_SCALE = 0.1
"""Trainable vision-backbone parameters (the tiny models' conv; the mini VLA's backbone is frozen)
learn at this fraction of the learning rate."""


@dataclass
class Example:
    images: list[np.ndarray]  # one uint8 [H, W, 3] per view, primary first
    instruction: str
    tokens: np.ndarray  # [7] action token ids
    patches: np.ndarray | torch.Tensor | None = None
    """Cached vision-backbone features of the prompt views [V*N, C]; when set, `images` is not
    read (the backbone is frozen, so its output can be computed once and reused)."""
    state: np.ndarray | None = None
    """End-effector position [3] (read by a model with `proprio_dim` > 0 and by a state prior)."""
    gripper_gap: float | None = None
    """Opening between the fingers at this step (m; read by a model with `proprio_gripper_gap`
    and by a state prior)."""


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


def prompt_patches(vla, batch: Sequence[Example]) -> torch.Tensor:
    """Backbone features of each example's prompt views [B, V*N, C] (cached ones where present)."""
    if all(ex.patches is not None for ex in batch):
        rows = [ex.patches if torch.is_tensor(ex.patches) else torch.from_numpy(np.array(ex.patches, np.float32))
                for ex in batch]
        return torch.stack([r.to(device=vla.device, dtype=vla.dtype) for r in rows])
    n = vla.prompt_views
    patches = vla.vision_backbone(vla.preprocess([img for ex in batch for img in ex.images[:n]]))
    return patches.reshape(len(batch), -1, patches.shape[-1])


def prompt_batch(vla, batch: Sequence[Example]) -> torch.Tensor:
    """Prompt embeddings of a batch with one instruction [B, P, D]."""
    visual = vla.projector(prompt_patches(vla, batch))  # [B, V*N, D]
    return torch.stack([vla.prompt_embeds(ex.instruction, visual[i], state=ex.state, gripper_gap=ex.gripper_gap)[0]
                        for i, ex in enumerate(batch)])


def teacher_forced(vla, batch: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Run prompt + the examples' action tokens causally. Returns (hidden [B, P+7, D], input
    embeds [B, P+7, D], P)."""
    prompt = prompt_batch(vla, batch)
    tokens = torch.tensor(np.stack([ex.tokens for ex in batch]), device=vla.device)
    embeds = torch.cat([prompt, vla.get_input_embeddings()(tokens)], dim=1)
    hidden = vla.language_model.model(inputs_embeds=embeds).last_hidden_state
    return hidden, embeds, prompt.shape[1]


def _optimise(loss: torch.Tensor, params, opt, sched) -> float:
    """One clipped optimiser + scheduler step; returns the loss value."""
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def action_logits(vla, hidden_at_action_positions: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [..., 256] logits; column j is token first_token_id + j."""
    return hidden_at_action_positions @ vla.action_head_weight().T


def cpu_has_fast_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has bf16 matmul instructions (AVX-512 BF16 or AMX).

    Without them bf16 autocast is emulated and several times slower than fp32."""
    try:
        text = open(cpuinfo, encoding="utf-8", errors="replace").read()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _autocast(bf16: bool, device: torch.device):
    """bf16 autocast (about 2x faster matmuls on CPUs with AVX-512 BF16; master weights stay fp32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def train_vla(
    vla, examples: Sequence[Example], steps: int, batch_size: int = 16, lr: float = 1e-3, seed: int = 0,
    progress: Callable[[int, float], None] | None = None, bf16_autocast: bool = False,
) -> list[float]:
    """Cross-entropy on the 7 action tokens; returns the loss curve. Trainable vision-backbone
    parameters (if any) learn at `BACKBONE_LR_SCALE` x `lr`."""
    torch.manual_seed(seed)
    vla.train()
    backbone_ids = {id(p) for p in vla.vision_backbone.parameters()}
    trainable = [p for p in vla.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in backbone_ids], "lr": lr},
              {"params": [p for p in trainable if id(p) in backbone_ids], "lr": lr * BACKBONE_LR_SCALE}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    first = vla.action_tokenizer.first_token_id
    losses = []
    for i, batch in enumerate(_batches(examples, batch_size, steps, seed)):
        with _autocast(bf16_autocast, vla.device):
            hidden, _, p = teacher_forced(vla, batch)
            logits = action_logits(vla, hidden[:, p - 1 : p - 1 + ACTION_DIM])
        target = torch.tensor(np.stack([ex.tokens for ex in batch]), device=logits.device) - first
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256).float(), target.reshape(-1))
        losses.append(_optimise(loss, vla.parameters(), opt, sched))
        if progress:
            progress(i, losses[-1])
    vla.eval()
    return losses


def greedy_tokens(vla, examples: Sequence[Example], batch_size: int = 1, use_cache: bool = False,
                  state_prior: ActionPrior | None = None) -> list[Example]:
    """Replace each example's tokens by the VLA's own greedy action tokens (plain AR; with
    `state_prior`, the tokens the engine decodes under that prior).

    batch_size > 1 decodes consecutive examples with the same instruction together (same prompt
    length, so no padding); use_cache decodes with a KV cache (~6x less compute); the output
    keeps the input order.
    """
    tokens, _ = greedy_decode(vla, examples, batch_size, use_cache, state_prior)
    return [dataclasses.replace(ex, tokens=tokens[k]) for k, ex in enumerate(examples)]


def prior_bias(state_prior: ActionPrior | None, batch: Sequence[Example],
               device: torch.device) -> torch.Tensor | None:
    """The state prior's bias of each example [B, 7, 256] (zero for a task it does not know), or
    None (no prior, or no example of a task it knows)."""
    if state_prior is None:
        return None
    rows = [state_prior.bias(ex.instruction, ex.state, ex.gripper_gap) for ex in batch]
    if all(r is None for r in rows):
        return None
    return torch.stack([torch.zeros(ACTION_DIM, 256) if r is None else r for r in rows]).to(device)


def _same_instruction_runs(examples: Sequence[Example], batch_size: int):
    """(start, end) of consecutive runs of at most `batch_size` examples with one instruction."""
    i = 0
    while i < len(examples):
        j = i + 1
        while j < len(examples) and j - i < batch_size and examples[j].instruction == examples[i].instruction:
            j += 1
        yield i, j
        i = j


def greedy_decode(
    vla, examples: Sequence[Example], batch_size: int = 1, use_cache: bool = False,
    state_prior: ActionPrior | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy AR decoding of each example: (tokens [N, 7], f_live [N, D]), where f_live is the
    mean of the 7 lm_head inputs that produced the tokens (the engine's live feature). With
    `state_prior`, its bias is added to the action logits as the engine's verifier adds it."""
    first = vla.action_tokenizer.first_token_id
    all_tokens = np.zeros((len(examples), ACTION_DIM), np.int64)
    all_feats = np.zeros((len(examples), vla.hidden_size), np.float32)
    lm = vla.language_model.model
    with torch.inference_mode():
        for i, j in _same_instruction_runs(examples, batch_size):
            batch = examples[i:j]
            embeds = prompt_batch(vla, batch)
            cache = None
            if use_cache:
                from transformers import DynamicCache

                cache = DynamicCache()
            tokens, producers = [], []
            step_in = embeds
            bias = prior_bias(state_prior, batch, vla.device)
            for k in range(ACTION_DIM):
                if use_cache:
                    h = lm(inputs_embeds=step_in, cache=cache, use_cache=True).last_hidden_state[:, -1]
                else:
                    h = lm(inputs_embeds=embeds).last_hidden_state[:, -1]
                logits = action_logits(vla, h)
                if bias is not None:
                    logits = logits.float() + bias[:, k]
                tok = first + logits.argmax(-1)  # [B]
                tokens.append(tok)
                producers.append(h.float())
                step_in = vla.get_input_embeddings()(tok)[:, None]
                embeds = torch.cat([embeds, step_in], 1)
            all_tokens[i:j] = torch.stack(tokens, 1).cpu().numpy()
            all_feats[i:j] = torch.stack(producers, 1).mean(1).cpu().numpy()
    return all_tokens, all_feats


def train_drafter(
    vla, examples: Sequence[Example], steps: int, batch_size: int = 16, lr: float = 3e-3, seed: int = 0,
    feature_noise: float = 0.05, progress: Callable[[int, float], None] | None = None, bf16_autocast: bool = False,
) -> tuple[EagleDrafter, list[float]]:
    """Train an EagleDrafter on the VLA's features. `examples` should carry the VLA's own greedy tokens."""
    torch.manual_seed(seed)
    drafter = EagleDrafter(vla.language_model.config).to(vla.dtype)
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    losses = []
    for i, batch in enumerate(_batches(examples, batch_size, steps, seed)):
        with torch.no_grad():  # the target in its own dtype: exact features and greedy tokens
            hidden, embeds, p = teacher_forced(vla, batch)
            target_logits = action_logits(vla, hidden[:, 1:])
        feats = hidden[:, :-1] + feature_noise * torch.randn_like(hidden[:, :-1]) * hidden.std()
        sl = slice(p - 1, p - 1 + ACTION_DIM - 1)
        with _autocast(bf16_autocast, vla.device):
            pred = drafter(feats, embeds[:, 1:])  # [B, P+6, D] ~ hidden[:, 1:]
            # Token loss where drafts are made: predictions of a2..a7 (features at a1..a6).
            logits = action_logits(vla, pred[:, sl]).float()
        reg = nn.functional.smooth_l1_loss(pred.to(hidden.dtype), hidden[:, 1:])
        ce = nn.functional.cross_entropy(logits.reshape(-1, 256), target_logits[:, sl].argmax(-1).reshape(-1))
        loss = reg + 0.1 * ce
        losses.append(_optimise(loss, drafter.parameters(), opt, sched))
        if progress:
            progress(i, losses[-1])
    drafter.eval()
    return drafter, losses
