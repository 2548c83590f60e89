"""`heisd-libero train-vla`: train the mini VLA on LIBERO-layout demonstrations (docs/design.md §3).

Usage:
    heisd-libero train-vla --demos artifacts/demos/libero_object --out artifacts/mini_vla \
        [--image-size 128] [--steps 1500] [--batch-size 32] [--seed 0] [--hidden-size 384] [--layers 6]
        [--val-fraction 0.1] [--cache-dir DIR] [--tasks 0-9] [--max-episodes-per-task N] [--fp32] [--threads 1]
        [--prompt-views 1|2] [--proprio [--gripper-gap]] [--init-from DIR]

Model: EfficientNet-Lite0 with the real ImageNet weights (frozen) -> 2-layer MLP projector -> a
small LLaMA decoder trained from scratch (default 6 layers, hidden 384, 6 heads / 2 KV heads,
MLP 1024; docs/mini_vla.md explains the choice), with the word-hash prompt tokenizer and 256
OpenVLA action tokens at the end of the vocabulary. By default only the primary view (agentview)
feeds the prompt, as in OpenVLA; `--prompt-views 2` adds the wrist view's patches, `--proprio`
one token of the end-effector position and `--gripper-gap` the finger opening on that token
(docs/mini_vla.md). Both views form the retrieval query either way (docs/design.md §2). Norm
stats (q01/q99) come from the training episodes' actions.

The frozen backbone's patch features are computed once per demo step and cached on disk
(`--cache-dir`, default `<out>_features/`), so training runs the projector and the LLM only.
`--val-fraction` of each task's episodes is held out to measure teacher-forced token accuracy.

Writes `<out>/` in the on-disk form `load_vla` reads (config.json, model.safetensors,
dataset_statistics.json) and `<out>/train_log.json` (config, seed, git revision, split, loss
curve, held-out accuracy curve, seconds per stage).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.errors import ConfigError
from heisd_ros.tools.args import parse_tasks

EVAL_SUBSET = 2048
"""Held-out steps used for the accuracy curve during training (the final figure uses all)."""


@dataclass(frozen=True)
class TrainVLAConfig:
    demos: str = "artifacts/demos/libero_object"
    out: str = "artifacts/mini_vla"
    image_size: int = 128
    """Input size in pixels of both views (EfficientNet-Lite0: (image_size / 32)^2 patch tokens)."""
    hidden_size: int = 384
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    intermediate_size: int = 1024
    hash_text_ids: int = 1024
    """Prompt word buckets of the hash tokenizer (LIBERO-Object's ~30 words: no collisions at 1024)."""
    steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    val_fraction: float = 0.1
    eval_every_steps: int = 500
    cache_dir: str = ""
    tasks: tuple[int, ...] | None = None
    max_episodes_per_task: int = 0
    """0 = all episodes."""
    bf16_autocast: bool | None = None
    """Train under bf16 autocast (weights stay fp32); None: only where the CPU has bf16 matmul
    instructions (about 2x faster there, ~3.6x slower without: `cpu_has_fast_bf16`)."""
    threads: int = 1
    prompt_views: int = 1
    """Views whose patches enter the prompt (1: agentview, as OpenVLA; 2: + wrist)."""
    proprio: bool = False
    """Add the end-effector position as one prompt token (normalised by the training episodes)."""
    gripper_gap: bool = False
    """The state token also reads the opening between the fingers (needs `proprio`;
    `VLAConfig.proprio_gripper_gap`)."""
    init_from: str = ""
    """Start from this saved VLA (its architecture, tokenizer, norm stats and state prior; the size
    options above are ignored) instead of from scratch: fine-tuning on more demonstrations."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.bf16_autocast is None:  # resolved here, so the training log records what ran
            from heisd_ros.pipeline.training import cpu_has_fast_bf16

            object.__setattr__(self, "bf16_autocast", cpu_has_fast_bf16())
        for name in ("image_size", "hidden_size", "layers", "heads", "kv_heads", "intermediate_size",
                     "hash_text_ids", "steps", "batch_size", "eval_every_steps", "threads", "prompt_views"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.image_size % 32:
            raise ConfigError("image_size must be a multiple of 32 (EfficientNet stride)")
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ConfigError("hidden_size must divide by heads, heads by kv_heads")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError("val_fraction must be in [0, 1)")
        if self.lr <= 0:
            raise ConfigError("lr must be > 0")
        if self.gripper_gap and not self.proprio:
            raise ConfigError("--gripper-gap rides on the state token: add --proprio")

    @property
    def feature_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path(str(Path(self.out)) + "_features")


def mini_vla_config(cfg: TrainVLAConfig, ee_pos: np.ndarray | None = None):
    """VLAConfig of the mini VLA: EfficientNet-Lite0 + a LLaMA decoder of the configured size
    (+ the end-effector position token, normalised by `ee_pos` [T, 3] of the training episodes)."""
    from heisd_ros.models.vla import VLAConfig

    llm = dict(
        vocab_size=3 + cfg.hash_text_ids + 256,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        initializer_range=0.02,
    )
    proprio: dict = {}
    if cfg.proprio:
        if ee_pos is None or not len(ee_pos):
            raise ConfigError("--proprio needs the training episodes' end-effector positions")
        proprio = dict(proprio_dim=3, proprio_mean=tuple(float(x) for x in ee_pos.mean(0)),
                       proprio_std=tuple(float(x) for x in np.maximum(ee_pos.std(0), 1e-3)),
                       proprio_gripper_gap=cfg.gripper_gap)
    from heisd_ros.models.efficientnet import OUT_DIM

    return VLAConfig(vision="efficientnet_lite0", image_size=cfg.image_size, patch_size=32, vision_dim=OUT_DIM,
                     llm=llm, tokenizer="hash_words", hash_text_ids=cfg.hash_text_ids, unnorm_key="default",
                     prompt_views=cfg.prompt_views, **proprio)


def _limit(refs: list, per_task: int) -> list:
    if per_task <= 0:
        return refs
    count: dict[str, int] = {}
    kept = []
    for r in refs:
        if count.get(r.task, 0) < per_task:
            kept.append(r)
            count[r.task] = count.get(r.task, 0) + 1
    return kept


def _hash_collisions(tok, instructions: list[str]) -> list[list[str]]:
    import re

    words = sorted({w for s in instructions for w in re.findall(r"\w+|[^\w\s]", s.lower())})
    by_id: dict[int, list[str]] = {}
    for w in words:
        by_id.setdefault(tok.encode(w)[1], []).append(w)
    return [ws for ws in by_id.values() if len(ws) > 1]


def _examples(vla, stats, refs, val_refs, cache, progress: bool) -> tuple[list, list]:
    """(train, held-out) Examples with cached backbone features."""
    from heisd_ros.pipeline.features import episode_examples
    from heisd_ros.pipeline.outputs import progress_bar

    held = set(val_refs)
    train, val = [], []
    bar = progress_bar(len(refs), "features", progress)
    for r in refs:
        (val if r in held else train).extend(episode_examples(vla, stats, r, cache))
        bar.update(1)
    bar.close()
    return train, val


def _train(vla, train: list, val: list, cfg: TrainVLAConfig) -> tuple[list[float], list[dict]]:
    """train_vla with a progress bar and the held-out accuracy every `eval_every_steps`."""
    from heisd_ros.pipeline.features import token_accuracy
    from heisd_ros.pipeline.outputs import progress_bar
    from heisd_ros.pipeline.training import train_vla

    curve: list[dict] = []
    val_subset = val[:: max(1, len(val) // EVAL_SUBSET)] if val else []
    bar = progress_bar(cfg.steps, "train-vla", cfg.progress)

    def progress(i: int, loss: float) -> None:
        bar.update(1)
        if (i + 1) % 25 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")
        if val_subset and ((i + 1) % cfg.eval_every_steps == 0 or i + 1 == cfg.steps):
            acc = token_accuracy(vla, val_subset)
            vla.train()
            curve.append({"step": i + 1, "token_accuracy": acc["token_accuracy"],
                          "mean_abs_bin_error": acc["mean_abs_bin_error"]})
            bar.set_postfix(loss=f"{loss:.3f}", val_acc=f"{acc['token_accuracy']:.3f}")

    losses = train_vla(vla, train, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                       progress=progress, bf16_autocast=cfg.bf16_autocast)
    bar.close()
    return losses, curve


def _start_model(cfg: TrainVLAConfig, train_refs: list):
    """(VLA, its norm stats, the state prior to carry over or None): `--init-from`'s model, or a
    fresh mini VLA with norm stats and state normalisation from the training episodes."""
    from heisd_ros.core.action_tokenizer import NormStats
    from heisd_ros.models.loader import load_policy_model, require_heisd_vla
    from heisd_ros.models.text_tokenizer import HashWordTokenizer
    from heisd_ros.models.vla import VLAModel
    from heisd_ros.pipeline.episodes import load_episode

    if cfg.init_from:
        # Keep the starting model's norm stats: a token must keep meaning the same action (and the
        # state prior, which predicts those tokens, stays valid).
        require_heisd_vla(cfg.init_from, "heisd-libero train-vla --init-from")
        vla, prior = load_policy_model(cfg.init_from, dtype="float32")
        return vla.eval(), vla.stats(), prior
    train_eps = [load_episode(r, with_images=False) for r in train_refs]
    vcfg = mini_vla_config(cfg, np.concatenate([e.ee_pos for e in train_eps]))
    stats = NormStats.fit(np.concatenate([e.actions for e in train_eps]))
    return VLAModel(vcfg, {vcfg.unnorm_key: stats}, HashWordTokenizer(cfg.hash_text_ids)).eval(), stats, None


def run(cfg: TrainVLAConfig) -> dict:
    from heisd_ros.pipeline.episodes import scan_hdf5, split_episodes
    from heisd_ros.pipeline.features import FeatureCache, token_accuracy
    from heisd_ros.pipeline.outputs import git_revision, write_json

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    t0 = time.perf_counter()
    refs = _limit(scan_hdf5(cfg.demos, cfg.tasks), cfg.max_episodes_per_task)
    train_refs, val_refs = split_episodes(refs, cfg.val_fraction, cfg.seed)
    if not train_refs:
        raise ConfigError(f"no training episodes in {cfg.demos}")
    vla, stats, prior = _start_model(cfg, train_refs)
    collisions = _hash_collisions(vla.text_tokenizer, sorted({r.task for r in refs}))
    t_cache = time.perf_counter()
    cache = FeatureCache(cfg.feature_cache_dir, vla)
    train, val = _examples(vla, stats, refs, val_refs, cache, cfg.progress)
    cache_s = time.perf_counter() - t_cache
    t_train = time.perf_counter()
    losses, curve = _train(vla, train, val, cfg)
    train_s = time.perf_counter() - t_train
    t_eval = time.perf_counter()
    final = {"held_out": token_accuracy(vla, val) if val else None,
             "train_sample": token_accuracy(vla, train[:: max(1, len(train) // EVAL_SUBSET)])}
    eval_s = time.perf_counter() - t_eval
    vla.save_pretrained(cfg.out)
    if prior is not None:
        prior.save(cfg.out)
    n_params = {name: sum(p.numel() for p in getattr(vla, name).parameters())
                for name in ("vision_backbone", "projector", "language_model")}
    log = {
        "command": "heisd-libero train-vla",
        "config": {**dataclasses.asdict(cfg), "tasks": list(cfg.tasks) if cfg.tasks else None},
        "vla_config": dataclasses.asdict(vla.cfg),
        "seed": cfg.seed,
        "git_revision": git_revision(),
        "threads": cfg.threads,
        "n_params": n_params,
        "n_trainable_params": sum(p.numel() for p in vla.parameters() if p.requires_grad),
        "prompt_tokens": len(vla._prompt_ids(train[0].instruction)) + cfg.prompt_views * (cfg.image_size // 32) ** 2 + int(cfg.proprio),
        "hash_collisions": collisions,
        "episodes": {"train": len(train_refs), "held_out": len(val_refs),
                     "held_out_sources": [r.source for r in val_refs]},
        "steps": {"train": len(train), "held_out": len(val)},
        "loss_curve": [float(x) for x in losses],
        "held_out_curve": curve,
        "final": final,
        "seconds": {"features": cache_s, "train": train_s, "eval": eval_s, "total": time.perf_counter() - t0},
        "feature_cache": {"dir": str(cache.dir), "computed": cache.computed, "reused": cache.hits},
    }
    write_json(Path(cfg.out) / "train_log.json", log)
    return log


def build_parser() -> argparse.ArgumentParser:
    d = TrainVLAConfig()
    p = argparse.ArgumentParser(prog="heisd-libero train-vla", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demos", default=d.demos, help="directory of LIBERO-layout *.hdf5 files (or one file)")
    p.add_argument("--out", default=d.out, help="model directory to write")
    p.add_argument("--image-size", type=int, default=d.image_size)
    p.add_argument("--hidden-size", type=int, default=d.hidden_size)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--intermediate-size", type=int, default=d.intermediate_size)
    p.add_argument("--hash-text-ids", type=int, default=d.hash_text_ids)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--val-fraction", type=float, default=d.val_fraction)
    p.add_argument("--eval-every", type=int, default=d.eval_every_steps, dest="eval_every_steps")
    p.add_argument("--cache-dir", default=d.cache_dir, help="feature cache (default: <out>_features)")
    p.add_argument("--tasks", default=None, help="task indices, e.g. 0-9 or 0,3 (default: all files)")
    p.add_argument("--max-episodes-per-task", type=int, default=d.max_episodes_per_task)
    p.add_argument("--fp32", dest="bf16_autocast", action="store_false", default=None,
                   help="train in fp32 (default: bf16 autocast only on CPUs with bf16 instructions)")
    p.add_argument("--bf16", dest="bf16_autocast", action="store_true", help="train under bf16 autocast")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads (default 1)")
    p.add_argument("--prompt-views", type=int, default=d.prompt_views,
                   help="views whose patches enter the prompt: 1 = agentview (OpenVLA), 2 = + wrist")
    p.add_argument("--proprio", action="store_true", help="add the end-effector position as a prompt token")
    p.add_argument("--gripper-gap", action="store_true",
                   help="the state token also reads the opening between the fingers (demos need obs/gripper_states)")
    p.add_argument("--init-from", default=d.init_from,
                   help="fine-tune this saved VLA (its architecture, norm stats and state prior) instead of "
                        "training from scratch")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    args["tasks"] = parse_tasks(args["tasks"])
    cfg = TrainVLAConfig(**args)
    log = run(cfg)
    held = log["final"]["held_out"]
    acc = f"{held['token_accuracy']:.3f}" if held else "n/a (no held-out episodes)"
    print(f"train-vla: {log['steps']['train']} steps of {log['episodes']['train']} episodes, "
          f"final loss {np.mean(log['loss_curve'][-50:]):.3f}, held-out token accuracy {acc}, "
          f"{log['seconds']['total']:.0f} s -> {cfg.out}")
    return 0
