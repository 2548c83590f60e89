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
from heisd_ros.core.types import ACTION_DIM


@dataclass
class Example:
    images: list[np.ndarray]  # one uint8 [H, W, 3] per view, primary first
    instruction: str
    tokens: np.ndarray  # [7] action token ids
    patches: np.ndarray | torch.Tensor | None = None
    """Cached vision-backbone features of the prompt views [V*N, C]; when set, `images` is not
    read (the backbone is frozen, so its output can be computed once and reused)."""
    state: np.ndarray | None = None
    """End-effector position [3] (read only by a model with `proprio_dim` > 0)."""
    prev_gripper: float | None = None
    """The previous step's gripper command, -1 at an episode's start (read only by a model with
    `proprio_prev_gripper`)."""
    gripper_dwell: int | None = None
    """For how many steps before this one `prev_gripper` has been executed without a change (0 at an
    episode's start; read only by a model with `proprio_gripper_dwell`)."""
    gripper_gap: float | None = None
    """Opening between the fingers at this step (m; read only by a model with `proprio_gripper_gap`)."""
    episode_patches: np.ndarray | None = None
    """Cached prompt-view patches of every step of this example's episode [T, V*N, C] (a shared
    array, not a copy) and this example's row in it: `image_jitter` draws the image from nearby steps."""
    step: int = 0


def jitter_images(batch: Sequence[Example], max_steps: int, rng: np.random.Generator) -> list[Example]:
    """Each example's patches replaced by those of a step up to `max_steps` before or after it in the
    same episode (clipped to the episode); labels, state and dwell stay the example's own.

    Why (NOTES 38): in the demos the image pins down the end-effector position as well as the state
    token does, so a policy learns to act on the image and ignores its position (probe gain ~0);
    closed loop, a 4 x 4 grid of frozen features reads the position centimetres off. With the image
    a few steps out of date, it still says which phase and object, but only the state token says
    exactly where the hand is: the policy has to read it."""
    if max_steps <= 0:
        return list(batch)
    out = []
    for ex in batch:
        if ex.episode_patches is None:
            raise ValueError("image_jitter needs cached episode features (Example.episode_patches)")
        t = int(np.clip(ex.step + rng.integers(-max_steps, max_steps + 1), 0, len(ex.episode_patches) - 1))
        out.append(dataclasses.replace(ex, patches=ex.episode_patches[t]))
    return out


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


def prompt_batch(vla, batch: Sequence[Example], drop_image: np.ndarray | None = None) -> torch.Tensor:
    """Prompt embeddings of a batch with one instruction [B, P, D]; rows where `drop_image` [B] is
    True get zero visual tokens (training only: `image_dropout`)."""
    visual = vla.projector(prompt_patches(vla, batch))  # [B, V*N, D]
    if drop_image is not None and drop_image.any():
        keep = torch.as_tensor(~drop_image, device=visual.device, dtype=visual.dtype)
        visual = visual * keep[:, None, None]
    return torch.stack([vla.prompt_embeds(ex.instruction, visual[i], state=ex.state, prev_gripper=ex.prev_gripper,
                                           gripper_dwell=ex.gripper_dwell, gripper_gap=ex.gripper_gap)[0]
                        for i, ex in enumerate(batch)])


def teacher_forced(
    vla, batch: Sequence[Example], input_tokens: np.ndarray | None = None, drop_image: np.ndarray | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Run prompt + action tokens causally. Returns (hidden [B, P+7, D], input embeds [B, P+7, D], P).

    `input_tokens` [B, 7] replaces the action tokens fed as inputs (the targets stay the examples'
    own; see `swap_prefix_tokens`); `drop_image` [B] blanks those rows' visual tokens."""
    prompt = prompt_batch(vla, batch, drop_image)
    if input_tokens is None:
        input_tokens = np.stack([ex.tokens for ex in batch])
    tokens = torch.tensor(input_tokens, device=vla.device)
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

    Without them bf16 autocast is emulated and slower than fp32: measured here on an AVX-512 Xeon
    without BF16, train-vla ran 0.53 steps/s under bf16 autocast and 1.91 in fp32 (NOTES 25)."""
    try:
        text = open(cpuinfo, encoding="utf-8", errors="replace").read()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _autocast(bf16: bool, device: torch.device):
    """bf16 autocast (about 2x faster matmuls on CPUs with AVX-512 BF16; master weights stay fp32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def random_shift(images: Sequence[np.ndarray], pad_px: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each [H, W, 3] image shifted by up to ±`pad_px` pixels in x and y (edge-padded, cropped back
    to its size): the DrQ / diffusion-policy augmentation, so the policy does not key on exact
    pixel positions of a handful of demonstrations."""
    out = []
    for img in images:
        h, w = img.shape[:2]
        padded = np.pad(img, ((pad_px, pad_px), (pad_px, pad_px), (0, 0)), mode="edge")
        dy, dx = rng.integers(0, 2 * pad_px + 1, size=2)
        out.append(padded[dy : dy + h, dx : dx + w])
    return out


def _augmented(batch: Sequence[Example], shift_px: int, rng: np.random.Generator) -> Sequence[Example]:
    if shift_px <= 0:
        return batch
    if any(ex.patches is not None for ex in batch):
        raise ValueError("image augmentation needs examples with images, not cached patches")
    return [dataclasses.replace(ex, images=random_shift(ex.images, shift_px, rng)) for ex in batch]


def swap_prefix_tokens(tokens: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """Teacher-forcing inputs [B, 7] in which each action token is, with probability `p`, replaced
    by the same dimension's token of another random example of the batch.

    Why: with clean teacher forcing the earlier tokens of a step predict the later ones almost
    perfectly (in the demos a closed gripper goes with a lift, an open one with a descent), so the
    model learns to read the gripper token off the six tokens before it rather than off the image
    (NOTES 30: given another phase's prefix, the shipped policy's gripper token followed the prefix
    52 % of the time). In closed loop one wrong translation token then flips the gripper. Swapped
    inputs make every token answer to the image; the targets stay the example's own."""
    out = np.array(tokens, copy=True)
    if p <= 0.0 or out.shape[0] < 2:
        return out
    b = out.shape[0]
    swap = rng.random(out.shape) < p
    # A donor row different from each row: shift by 1..b-1.
    donors = (np.arange(b)[:, None] + rng.integers(1, b, size=out.shape)) % b
    cols = np.broadcast_to(np.arange(out.shape[1]), out.shape)
    out[swap] = tokens[donors[swap], cols[swap]]
    return out


def train_vla(
    vla, examples: Sequence[Example], steps: int, batch_size: int = 16, lr: float = 1e-3, seed: int = 0,
    progress: Callable[[int, float], None] | None = None, bf16_autocast: bool = False,
    backbone_lr_scale: float = 0.1, shift_px: int = 0, prefix_swap: float = 0.0, image_dropout: float = 0.0,
    image_jitter: int = 0,
) -> list[float]:
    """Cross-entropy on the 7 action tokens; returns the loss curve. Trainable vision-backbone
    parameters (if any) learn at `backbone_lr_scale` x `lr`, as pretrained weights usually need;
    `shift_px` > 0 shifts every training image randomly (`random_shift`; examples need images);
    `prefix_swap` > 0 corrupts the teacher-forced action inputs (`swap_prefix_tokens`);
    `image_dropout` > 0 blanks the visual tokens of that share of the examples, so the state token
    alone has to predict their actions (NOTES 35: otherwise the policy ignores it);
    `image_jitter` > 0 shows each example the image of a step up to that many steps away in its
    episode (`jitter_images`), so the exact position has to come from the state token."""
    torch.manual_seed(seed)
    vla.train()
    backbone_ids = {id(p) for p in vla.vision_backbone.parameters()}
    trainable = [p for p in vla.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in backbone_ids], "lr": lr},
              {"params": [p for p in trainable if id(p) in backbone_ids], "lr": lr * backbone_lr_scale}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    first = vla.action_tokenizer.first_token_id
    rng = np.random.default_rng(seed)
    losses = []
    for i, batch in enumerate(_batches(examples, batch_size, steps, seed)):
        batch = jitter_images(_augmented(batch, shift_px, rng), image_jitter, rng)
        clean = np.stack([ex.tokens for ex in batch])
        with _autocast(bf16_autocast, vla.device):
            drop = rng.random(len(batch)) < image_dropout if image_dropout > 0 else None
            hidden, _, p = teacher_forced(vla, batch, swap_prefix_tokens(clean, prefix_swap, rng), drop)
            logits = action_logits(vla, hidden[:, p - 1 : p - 1 + ACTION_DIM])
        target = torch.tensor(clean, device=logits.device) - first
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256).float(), target.reshape(-1))
        losses.append(_optimise(loss, vla.parameters(), opt, sched))
        if progress:
            progress(i, losses[-1])
    vla.eval()
    return losses


def greedy_tokens(vla, examples: Sequence[Example], batch_size: int = 1, use_cache: bool = False) -> list[Example]:
    """Replace each example's tokens by the VLA's own greedy action tokens (plain AR).

    batch_size > 1 decodes consecutive examples with the same instruction together (same prompt
    length, so no padding); use_cache decodes with a KV cache (~6x less compute); the output
    keeps the input order.
    """
    tokens, _ = greedy_decode(vla, examples, batch_size, use_cache)
    return [dataclasses.replace(ex, tokens=tokens[k]) for k, ex in enumerate(examples)]


def prior_bias(vla, batch: Sequence[Example]) -> torch.Tensor | None:
    """The model's state-prior bias of each example [B, 7, 256] (models/state_prior.py), or None."""
    prior = getattr(vla, "state_prior", None)
    if prior is None:
        return None
    rows = [prior.bias(ex.instruction, ex.state, ex.gripper_gap) for ex in batch]
    if all(r is None for r in rows):
        return None
    return torch.stack([torch.zeros(ACTION_DIM, 256) if r is None else r for r in rows]).to(vla.device)


def greedy_decode(
    vla, examples: Sequence[Example], batch_size: int = 1, use_cache: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy AR decoding of each example: (tokens [N, 7], f_live [N, D]), where f_live is the
    mean of the 7 lm_head inputs that produced the tokens (the engine's live feature)."""
    first = vla.action_tokenizer.first_token_id
    all_tokens = np.zeros((len(examples), ACTION_DIM), np.int64)
    all_feats = np.zeros((len(examples), vla.hidden_size), np.float32)
    lm = vla.language_model.model
    with torch.inference_mode():
        i = 0
        while i < len(examples):
            j = i + 1
            while j < len(examples) and j - i < batch_size and examples[j].instruction == examples[i].instruction:
                j += 1
            batch = examples[i:j]
            embeds = prompt_batch(vla, batch)
            cache = None
            if use_cache:
                from transformers import DynamicCache

                cache = DynamicCache()
            tokens, producers = [], []
            step_in = embeds
            bias = prior_bias(vla, batch)
            for k in range(ACTION_DIM):
                if use_cache:
                    h = lm(inputs_embeds=step_in, cache=cache, use_cache=True).last_hidden_state[:, -1]
                else:
                    h = lm(inputs_embeds=embeds).last_hidden_state[:, -1]
                logits = action_logits(vla, h)
                if bias is not None:  # the engine's verifier adds the same bias (core/verifier.py)
                    logits = logits.float() + bias[:, k]
                tok = first + logits.argmax(-1)  # [B]
                tokens.append(tok)
                producers.append(h.float())
                step_in = vla.get_input_embeddings()(tok)[:, None]
                embeds = torch.cat([embeds, step_in], 1)
            all_tokens[i:j] = torch.stack(tokens, 1).cpu().numpy()
            all_feats[i:j] = torch.stack(producers, 1).mean(1).cpu().numpy()
            i = j
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
