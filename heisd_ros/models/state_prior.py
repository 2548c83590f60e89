"""A proprioceptive action prior: per task, a small MLP from (end-effector position, finger gap) to
log-probabilities over each action dimension's 256 bins, added to the VLA's action logits.

Why: a state policy follows the demonstrations only once it fits them closely (hundreds of
passes over a task's demos), far more training than a VLA's LLM gets on a CPU budget, so the VLA
never reads a state token well enough. The prior is that fitted state policy (about a minute of
training for all ten LIBERO-Object tasks); the VLA's own logits then refine it with the image.

Speculative decoding stays lossless: the prior is a per-step, per-action-index bias on the logits
the *verifier* takes its argmax over (`core.verifier.TargetSession`), so `ar` and every
speculative method decode the same combined policy token for token. Drafters and retrieval only
propose; they never decide a token.

On disk the prior lives in the VLA's directory (`state_prior.json` + `state_prior.safetensors`),
so a model directory is one policy; `heisd train-prior` writes a copy of a VLA directory with it.
`heisd_ros.models.loader.load_policy_model` loads both; the decoder holds the prior
(`HybridDecoder(..., state_prior=...)`), the VLA does not.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from heisd_ros.core.errors import InvalidObservationError, ModelLoadError
from heisd_ros.core.files import read_json

N_BINS = 256
ACTION_DIM = 7
CONFIG_FILE = "state_prior.json"
WEIGHTS_FILE = "state_prior.safetensors"
MAX_GAP_M = 0.2
"""Larger finger gaps are sensor errors (as `models.vla.MAX_GAP_M`)."""


def task_key(instruction: str) -> str:
    """The prior's key for an instruction (case, surrounding space and a final full stop ignored)."""
    return instruction.strip().lower().rstrip(".")


@dataclass(frozen=True)
class StatePriorConfig:
    """How the prior is built and how strongly it speaks; stored as state_prior.json."""

    hidden: int = 256
    steps: int = 10000
    """Optimiser steps per task (closed-loop success grows with the fit up to about here)."""
    batch_size: int = 256
    lr: float = 1e-3
    seed: int = 0
    weight: float = 1.0
    """The prior's log-probabilities are multiplied by this before they are added to the VLA's
    logits (1 = a product of the two experts)."""


def _mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, ACTION_DIM * N_BINS))


class StatePrior(nn.Module):
    """Per-task MLPs: (ee position [3], finger gap) -> log-probabilities [7, 256] per action column
    (column j = action token first_token_id + j, the order of the lm_head rows the verifier reads)."""

    def __init__(self, cfg: StatePriorConfig, tasks: Sequence[str], mean: np.ndarray, std: np.ndarray) -> None:
        super().__init__()
        if len(tasks) == 0 or len(set(tasks)) != len(tasks):
            raise ModelLoadError("a state prior needs at least one task and unique task keys")
        mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
        if mean.shape != (len(tasks), 4) or std.shape != (len(tasks), 4) or np.any(std <= 0):
            raise ModelLoadError(f"state prior statistics must be [{len(tasks)}, 4] with std > 0")
        self.cfg = cfg
        self.tasks = list(tasks)
        self._index = {t: i for i, t in enumerate(self.tasks)}
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float64), persistent=False)
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float64), persistent=False)
        self.nets = nn.ModuleList(_mlp(cfg.hidden) for _ in self.tasks)

    def knows(self, instruction: str) -> bool:
        return task_key(instruction) in self._index

    @torch.inference_mode()
    def bias(self, instruction: str, ee_pos, gripper_gap: float | None) -> torch.Tensor | None:
        """weight * log p(bin | state) [7, 256] in action-column order, or None for a task the
        prior was not trained on (the VLA then decides alone)."""
        i = self._index.get(task_key(instruction))
        if i is None:
            return None
        x = np.asarray(ee_pos, dtype=np.float64).reshape(-1)
        if x.shape != (3,) or not np.all(np.isfinite(x)):
            raise InvalidObservationError(f"the state prior needs a finite end-effector position [3], got {ee_pos!r}")
        if gripper_gap is None or not np.isfinite(gripper_gap) or not 0.0 <= gripper_gap <= MAX_GAP_M:
            raise InvalidObservationError(f"the state prior reads the finger gap (0-{MAX_GAP_M} m), got {gripper_gap!r}")
        z = (np.append(x, gripper_gap) - self.mean[i].numpy()) / self.std[i].numpy()
        net = self.nets[i]
        w = net[0].weight
        logits = net(torch.as_tensor(z, dtype=w.dtype, device=w.device)[None]).view(ACTION_DIM, N_BINS)
        return self.cfg.weight * torch.log_softmax(logits.float(), dim=-1)

    # -- persistence --------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        meta = {"config": dataclasses.asdict(self.cfg), "tasks": self.tasks,
                "mean": self.mean.tolist(), "std": self.std.tolist()}
        (d / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        # bfloat16 on disk: half the size of a committed policy; the prior still runs in float32.
        save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in self.state_dict().items()},
                  str(d / WEIGHTS_FILE))


def load_state_prior(directory: str | Path) -> StatePrior | None:
    """The prior saved in a model directory, or None where it has none."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    if not (d / CONFIG_FILE).is_file():
        return None
    try:
        meta = read_json(d / CONFIG_FILE, ModelLoadError)
        prior = StatePrior(StatePriorConfig(**meta["config"]), meta["tasks"], np.array(meta["mean"]), np.array(meta["std"]))
        state = {k: v.float() for k, v in load_file(str(d / WEIGHTS_FILE)).items()}
        prior.load_state_dict(state, strict=True)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, SafetensorError, RuntimeError, ValueError) as err:
        raise ModelLoadError(f"corrupt state prior in {d}: {err}") from err
    return prior.eval()


def fit_state_prior(episodes: dict[str, list[tuple[np.ndarray, np.ndarray]]], cfg: StatePriorConfig,
                    progress=None) -> tuple[StatePrior, dict]:
    """Train one MLP per task to (near) convergence.

    episodes: task key -> [(state [T, 4] = ee position + finger gap, action columns [T, 7])].
    Returns the prior and per task the final loss and training accuracy per action dimension.
    """
    tasks = sorted(episodes)
    data = []
    for t in tasks:
        x = np.concatenate([s for s, _ in episodes[t]]).astype(np.float64)
        y = np.concatenate([c for _, c in episodes[t]]).astype(np.int64)
        if x.ndim != 2 or x.shape[1] != 4 or y.shape != (x.shape[0], ACTION_DIM) or len(x) == 0:
            raise ValueError(f"task {t!r}: expected states [T, 4] and action columns [T, 7]")
        if y.min() < 0 or y.max() >= N_BINS:
            raise ValueError(f"task {t!r}: action columns must lie in [0, {N_BINS})")
        data.append((x, y))
    mean = np.stack([x.mean(0) for x, _ in data])
    std = np.stack([x.std(0) + 1e-6 for x, _ in data])
    torch.manual_seed(cfg.seed)
    prior = StatePrior(cfg, tasks, mean, std)
    report = {}
    for i, (t, (x, y)) in enumerate(zip(tasks, data)):
        X = torch.as_tensor((x - mean[i]) / std[i], dtype=torch.float32)
        Y = torch.as_tensor(y)
        net = prior.nets[i]
        opt = torch.optim.AdamW(net.parameters(), cfg.lr)
        g = torch.Generator().manual_seed(cfg.seed + i)
        for _ in range(cfg.steps):
            idx = torch.randint(0, len(X), (cfg.batch_size,), generator=g)
            loss = nn.functional.cross_entropy(net(X[idx]).view(-1, ACTION_DIM, N_BINS).transpose(1, 2), Y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (net(X).view(-1, ACTION_DIM, N_BINS).argmax(-1) == Y).float().mean(0)
        report[t] = {"final_loss": round(loss.item(), 4), "samples": int(len(X)),
                     "train_accuracy_per_dim": [round(float(a), 3) for a in acc]}
        if progress is not None:
            progress(1)
    return prior.eval(), report
