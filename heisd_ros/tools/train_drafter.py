"""`heisd train-drafter`: the EAGLE-style drafter head of a VLA (docs/design.md §2, §3).

Usage:
    heisd train-drafter --model artifacts/mini_vla --demos artifacts/demos/libero_object \
        --out artifacts/mini_drafter [--steps 1000] [--batch-size 32] [--seed 0] [--cache-dir DIR] [--tasks 0-9]
        [--engine-steps 200] [--threads 1] [--unnorm-key KEY] [--center-crop]
        [--bags DIR | --lerobot DIR] [--map ...] [--dataset NAME]   (the source flags of build-db)

The head (one LLaMA block over fc([token embedding ; feature])) learns from the VLA's *own*
hidden states: the demo steps are relabelled with the VLA's greedy action tokens (batched,
KV-cached AR under the model's state prior, if it has one, as the engine decodes; kept on disk
next to the feature cache for `heisd calibrate`), then trained
with feature regression + token cross-entropy (`heisd_ros.pipeline.training.train_drafter`).
Episodes the VLA held out (its train_log.json) stay held out here.

Reports, on held-out steps:
- top-1 agreement: the drafter's next-token prediction (from the VLA's feature at a_i and the
  embedding of a_{i+1}) equals the VLA's greedy a_{i+2}, for a2..a7 (the acceptance proxy);
- the engine's `drafter` method (strict D-SD, lossless) on `--engine-steps` held-out steps: mean
  accept length (tokens per verification forward), LLM forwards per step, and whether every
  step reproduced the AR greedy tokens.
Writes `<out>/` (drafter_config.json, drafter.safetensors, the form `load_drafter` reads) and
`<out>/drafter_log.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.sources import EpisodeSources, SourceOptions


@dataclass(frozen=True)
class TrainDrafterConfig:
    model: str = "artifacts/mini_vla"
    demos: str = ""
    bags: str = ""
    lerobot: str = ""
    dataset: str = ""
    source_options: SourceOptions = field(default_factory=SourceOptions)
    """Bag and LeRobot sources and how to read them, as for build-db (heisd_ros/tools/source_args.py)."""
    out: str = "artifacts/mini_drafter"
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0
    val_fraction: float = 0.1
    """Used only when the model has no train_log.json naming its held-out episodes."""
    cache_dir: str = ""
    """Feature cache of train-vla (default: <model>_features)."""
    unnorm_key: str = ""
    """The dataset whose action statistics tokenise the demonstrations ('' = the model's only or
    default one; an OpenVLA checkpoint trained on a mixture needs one)."""
    center_crop: bool = False
    """OpenVLA's 90 % centre crop of every frame, as the policy will run (LIBERO fine-tunes)."""
    tasks: tuple[int, ...] | None = None
    """HDF5 task indices (None = every file; give train-vla's)."""
    engine_steps: int = 200
    """Held-out steps decoded by the engine's `drafter` method for the accept-length figure (0 = skip)."""
    bf16_autocast: bool | None = None
    """bf16 autocast; None: only where the CPU has bf16 matmul instructions (`cpu_has_fast_bf16`)."""
    threads: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        if self.bf16_autocast is None:  # resolved here, so the training log records what ran
            from heisd_ros.pipeline.training import cpu_has_fast_bf16

            object.__setattr__(self, "bf16_autocast", cpu_has_fast_bf16())
        for name in ("steps", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.engine_steps < 0 or self.lr <= 0:
            raise ConfigError("engine_steps must be >= 0 and lr > 0")


def agreement(vla, drafter, own_examples, batch_size: int = 64) -> dict:
    """Top-1 agreement of the drafter with the VLA's greedy next token, per action position a2..a7."""
    from heisd_ros.core.types import ACTION_DIM
    from heisd_ros.pipeline.features import _same_instruction_batches
    from heisd_ros.pipeline.training import action_logits, teacher_forced

    hits = []
    with torch.inference_mode():
        for batch in _same_instruction_batches(own_examples, batch_size):
            hidden, embeds, p = teacher_forced(vla, batch)
            pred = drafter(hidden[:, :-1], embeds[:, 1:])
            sl = slice(p - 1, p - 1 + ACTION_DIM - 1)
            target = action_logits(vla, hidden[:, 1:][:, sl]).argmax(-1)
            hits.append((action_logits(vla, pred[:, sl]).argmax(-1) == target).cpu().numpy())
    if not hits:
        return {"n_steps": 0}
    ok = np.concatenate(hits)
    return {"n_steps": int(len(ok)), "top1_agreement": float(ok.mean()),
            "per_position": {f"a{i + 2}": float(x) for i, x in enumerate(ok.mean(0))},
            "chain_accept_mean": float(np.cumprod(ok, axis=1).sum(1).mean())}


def engine_accept_length(vla, drafter, refs, n_steps: int, seed: int, state_prior=None) -> dict:
    """Run the engine's `drafter` and `ar` methods on `n_steps` held-out steps (spread over `refs`)."""
    from heisd_ros.assembly import PolicyParts, assemble_decoders
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.types import Observation
    from heisd_ros.pipeline.episodes import VIEWS, load_episode

    if n_steps <= 0 or not refs:
        return {}
    per_episode = max(1, n_steps // len(refs))
    rng = np.random.default_rng(seed)
    views = VIEWS[: vla.prompt_views]  # what the prompt reads: a one-camera recording suffices for OpenVLA
    decoders = assemble_decoders(PolicyParts(vla, state_prior, drafter),
                                 {m: DecoderConfig(method=m, views=views) for m in ("ar", "drafter")})
    ar, sd = decoders["ar"], decoders["drafter"]
    accept, forwards, same, ms_ar, ms_sd = [], [], [], [], []
    for ref in refs:
        ep = load_episode(ref)
        for t in sorted(rng.choice(ep.length, min(per_episode, ep.length), replace=False)):
            obs = Observation({v: ep.images[v][t] for v in views}, ep.instruction, ep.ee_pos[t],
                              gripper_gap=ep.finger_gap(t))
            _, st_ar = ar.step(obs)
            _, st = sd.step(obs)
            accept.append(st.accept_length)
            forwards.append(st.llm_forwards)
            same.append(st.tokens == st_ar.tokens)
            ms_ar.append(st_ar.latency_ms["total"])
            ms_sd.append(st.latency_ms["total"])
        if len(accept) >= n_steps:
            break
    return {"n_steps": len(accept), "mean_accept_length": float(np.mean(accept)),
            "llm_forwards_per_step": float(np.mean(forwards)), "ar_forwards_per_step": 7.0,
            "lossless_all_steps": bool(all(same)),
            "median_step_ms": {"ar": float(np.median(ms_ar)), "drafter": float(np.median(ms_sd))}}


def run(cfg: TrainDrafterConfig) -> dict:
    from heisd_ros.models.loader import load_model
    from heisd_ros.models.spec import ModelSpec
    from heisd_ros.pipeline.episodes import load_episode
    from heisd_ros.pipeline.features import (FeatureCache, GreedyCache, episode_tokens, held_out_split,
                                             own_examples)
    from heisd_ros.pipeline.outputs import git_revision, progress_bar, write_json
    from heisd_ros.pipeline.training import train_drafter

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    vla, prior = load_model(ModelSpec(cfg.model, unnorm_key=cfg.unnorm_key, center_crop=cfg.center_crop))
    refs = EpisodeSources.of(cfg).refs()
    train_refs, val_refs = held_out_split(refs, cfg.model, cfg.val_fraction, cfg.seed)
    cache_dir = cfg.cache_dir or str(Path(cfg.model)) + "_features"
    cache = FeatureCache(cache_dir, vla)
    greedy = GreedyCache(cache_dir, vla, cfg.model, state_prior=prior, center_crop=cfg.center_crop)
    t_greedy = time.perf_counter()
    own, _ = own_examples(vla, train_refs, cache, greedy, "greedy relabel", cfg.progress)
    own_val, _ = own_examples(vla, val_refs, cache, greedy, "greedy relabel (held out)", cfg.progress)
    greedy_s = time.perf_counter() - t_greedy
    demo = [t for r in train_refs for t in episode_tokens(vla, vla.stats(), load_episode(r, with_images=False).actions)]
    demo_match = float(np.mean([np.array_equal(a.tokens, b) for a, b in zip(own, demo)]))

    bar = progress_bar(cfg.steps, "train-drafter", cfg.progress)

    def progress(i: int, loss: float) -> None:
        bar.update(1)
        if (i + 1) % 25 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")

    t_train = time.perf_counter()
    drafter, losses = train_drafter(vla, own, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                                    seed=cfg.seed, progress=progress, bf16_autocast=cfg.bf16_autocast)
    bar.close()
    train_s = time.perf_counter() - t_train
    drafter.save(cfg.out)
    t_eval = time.perf_counter()
    held = agreement(vla, drafter, own_val) if own_val else None
    train_sample = agreement(vla, drafter, own[:: max(1, len(own) // 2048)])
    engine = engine_accept_length(vla, drafter, val_refs, cfg.engine_steps, cfg.seed, prior)
    log = {
        "command": "heisd train-drafter",
        "config": dataclasses.asdict(cfg),
        "seed": cfg.seed,
        "git_revision": git_revision(),
        "threads": cfg.threads,
        "n_params": sum(p.numel() for p in drafter.parameters()),
        "steps": {"train": len(own), "held_out": len(own_val)},
        "vla_greedy_equals_demo_tokens": demo_match,
        "loss_curve": [float(x) for x in losses],
        "held_out_agreement": held,
        "train_agreement": train_sample,
        "engine_drafter_held_out": engine,
        "seconds": {"greedy_relabel": greedy_s, "train": train_s, "eval": time.perf_counter() - t_eval,
                    "total": time.perf_counter() - t0},
    }
    write_json(Path(cfg.out) / "drafter_log.json", log)
    return log


def build_parser() -> argparse.ArgumentParser:
    from heisd_ros.tools.source_args import add_source_arguments

    d = TrainDrafterConfig()
    p = argparse.ArgumentParser(prog="heisd train-drafter", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=d.model, help="VLA directory (heisd-libero train-vla --out, or an OpenVLA checkpoint)")
    p.add_argument("--out", default=d.out, help="drafter directory to write")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--val-fraction", type=float, default=d.val_fraction)
    p.add_argument("--cache-dir", default=d.cache_dir, help="feature cache (default: <model>_features)")
    p.add_argument("--engine-steps", type=int, default=d.engine_steps)
    p.add_argument("--unnorm-key", default="", help="dataset of the model's action statistics (default: its only one)")
    p.add_argument("--center-crop", action="store_true",
                   help="OpenVLA checkpoints: 90 %% centre crop of every frame, as the policy will run")
    p.add_argument("--fp32", dest="bf16_autocast", action="store_false", default=None,
                   help="train in fp32 (default: bf16 autocast only on CPUs with bf16 instructions)")
    p.add_argument("--bf16", dest="bf16_autocast", action="store_true", help="train under bf16 autocast")
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    add_source_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from heisd_ros.tools.args import parse_tasks
    from heisd_ros.tools.source_args import pop_options

    args = vars(build_parser().parse_args(argv))
    args["tasks"] = parse_tasks(args["tasks"])
    options = pop_options(args)
    cfg = TrainDrafterConfig(**args, source_options=options)
    log = run(cfg)
    held = log["held_out_agreement"]
    eng = log["engine_drafter_held_out"]
    agree = f"{held['top1_agreement']:.3f}" if held else "n/a"
    acc = f", engine accept length {eng['mean_accept_length']:.2f} (lossless {eng['lossless_all_steps']})" if eng else ""
    print(f"train-drafter: held-out top-1 agreement {agree}{acc}, {log['seconds']['total']:.0f} s -> {cfg.out}")
    return 0
