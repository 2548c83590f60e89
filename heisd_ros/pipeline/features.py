"""From demonstration episodes to training examples, database points and live features.

Shared by `heisd-libero train-vla`, `train-drafter`, `build-db` and `calibrate` (a VLA saved by heisd or
an OpenVLA checkpoint, on demonstrations); `tiny_artifacts` does the same for synthetic data in
memory.

- `FeatureCache`: the frozen vision backbone's patch features of the views the prompt reads,
  computed once per demo step and kept on disk (fp16 .npy per episode and view) under the model's
  `fingerprint()`, so training runs projector + LLM only.
- `episode_examples`: `Example`s (cached patches, the demo's OpenVLA action tokens).
- `token_accuracy`: teacher-forced top-1 accuracy of the VLA on examples.
- `episode_points`: `DemoPoint`s of one episode (obs = `embed_views` over all views; feat /
  feat_prev by teacher-forcing the demo's own tokens).
- `GreedyCache` / `own_examples`: the VLA's own greedy tokens and live feature f_live per step
  (the mean lm_head input of its KV-cached greedy AR decoding, as the engine computes it), on
  disk per model: the drafter's training targets and the live features of calibration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from heisd_ros.core.action_tokenizer import NormStats
from heisd_ros.core.engine import embed_views, prompt_patches
from heisd_ros.core.errors import ModelLoadError
from heisd_ros.core.files import read_json
from heisd_ros.core.model_api import ActionPrior
from heisd_ros.core.types import ACTION_DIM
from heisd_ros.models.openvla_weights import INDEX_FILE as SHARD_INDEX
from heisd_ros.pipeline.episodes import VIEWS, DemoEpisode, EpisodeRef, load_episode
from heisd_ros.pipeline.training import Example, action_logits, greedy_decode, teacher_forced
from heisd_ros.pipeline.outputs import hash_file, progress_bar


def model_fingerprint(vla) -> str:
    """Where a model's backbone features are cached: the model's own `fingerprint()` (its backbone
    weights, input size and image transform; `VLAModel` and `OpenVLAAdapter` both say) and its dtype."""
    return vla.fingerprint() + _dtype_suffix(vla)


def _dtype_suffix(vla) -> str:
    """'' for a float32 model, '_bfloat16' etc. otherwise: features computed at another dtype differ
    (weights saved in bf16 load to the same float32 values, so the weights alone cannot tell)."""
    dtype = str(next(vla.language_model.parameters()).dtype).removeprefix("torch.")
    return "" if dtype == "float32" else f"_{dtype}"


class FeatureCache:
    """Patch features [T, V*N, C] (fp16) of an episode's prompt views, under `<directory>/<fingerprint>/`
    (one file per view: `<key>.npy` for the primary view, `<key>.v<i>.npy` for view i)."""

    def __init__(self, directory: str | Path, vla, batch_size: int = 32) -> None:
        self.vla = vla
        self.dir = Path(directory) / model_fingerprint(vla)
        self.batch_size = batch_size
        self.computed = 0
        self.hits = 0

    def path(self, ref: EpisodeRef, view: int = 0) -> Path:
        return self.dir / (f"{ref.key}.npy" if view == 0 else f"{ref.key}.v{view}.npy")

    def is_complete(self, ref: EpisodeRef) -> bool:
        return all(self.path(ref, v).is_file() for v in range(self.vla.prompt_views))

    def get(self, ref: EpisodeRef, episode: DemoEpisode | None = None) -> np.ndarray:
        views = [self._view(ref, v, episode) for v in range(self.vla.prompt_views)]
        return views[0] if len(views) == 1 else np.concatenate(views, axis=1)

    def _view(self, ref: EpisodeRef, view: int, episode: DemoEpisode | None) -> np.ndarray:
        p = self.path(ref, view)
        if p.is_file():
            arr = np.load(p, mmap_mode="r")
            if ref.length < 0 or arr.shape[0] == ref.length:
                self.hits += 1
                return np.asarray(arr)
        episode = episode or load_episode(ref)
        feats = primary_features(self.vla, episode.images[VIEWS[view]], self.batch_size)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp.npy")
        np.save(tmp, feats)
        tmp.replace(p)
        self.computed += 1
        return feats


def primary_features(vla, images: np.ndarray, batch_size: int = 32) -> np.ndarray:
    """[T, H, W, 3] uint8 -> backbone patch features [T, N, C] float16 (the model's own preprocess)."""
    out = []
    with torch.inference_mode():
        for s in range(0, len(images), batch_size):
            out.append(vla.vision_backbone(vla.preprocess(list(images[s : s + batch_size]))).float().cpu().numpy())
    return np.concatenate(out).astype(np.float16)


def finger_gaps(episode: DemoEpisode) -> list[float | None]:
    """`DemoEpisode.finger_gap` of every step."""
    return [episode.finger_gap(t) for t in range(episode.length)]


def episode_tokens(vla, stats: NormStats, actions: np.ndarray) -> np.ndarray:
    """Raw actions [T, 7] -> OpenVLA action tokens [T, 7] (q01/q99 normalisation, 256 bins)."""
    return vla.action_tokenizer.encode(stats.normalise(actions))


def episode_examples(vla, stats: NormStats, ref: EpisodeRef, cache: FeatureCache | None) -> list[Example]:
    """One Example per step of the episode, with cached prompt-view patches (or, without a
    cache, the prompt views' images), the end-effector position, the finger gap and the demo's
    tokens."""
    if cache is None:
        episode = load_episode(ref, with_images=True)
        tokens = episode_tokens(vla, stats, episode.actions)
        gap = finger_gaps(episode)
        views = [episode.images[VIEWS[v]] for v in range(vla.prompt_views)]
        return [Example([v[t] for v in views], episode.instruction, tokens[t], None, episode.ee_pos[t], gap[t])
                for t in range(len(tokens))]
    cached = ref.kind == "hdf5" and cache.is_complete(ref)
    episode = load_episode(ref, with_images=not cached)
    feats = cache.get(ref, None if cached else episode)
    tokens = episode_tokens(vla, stats, episode.actions)
    if len(feats) != len(tokens):
        raise ValueError(f"{ref.key}: {len(feats)} cached feature rows for {len(tokens)} steps")
    gap = finger_gaps(episode)
    return [Example([], episode.instruction, tokens[t], feats[t], episode.ee_pos[t], gap[t])
            for t in range(len(tokens))]


def token_accuracy(vla, examples: Sequence[Example], batch_size: int = 64) -> dict:
    """Teacher-forced top-1 accuracy on the 7 action tokens (per dimension and overall), the share
    of steps with all 7 right, and the mean |bin error|."""
    first = vla.action_tokenizer.first_token_id
    correct, bin_err = [], []
    with torch.inference_mode():
        for batch in _same_instruction_batches(examples, batch_size):
            hidden, _, p = teacher_forced(vla, batch)
            pred = action_logits(vla, hidden[:, p - 1 : p - 1 + ACTION_DIM]).argmax(-1).cpu().numpy() + first
            target = np.stack([ex.tokens for ex in batch])
            correct.append(pred == target)
            bin_err.append(np.abs(pred - target))
    if not correct:
        return {"n_steps": 0}
    ok = np.concatenate(correct)
    err = np.concatenate(bin_err)
    return {
        "n_steps": int(len(ok)),
        "token_accuracy": float(ok.mean()),
        "per_dim_accuracy": [float(x) for x in ok.mean(0)],
        "all_7_correct": float(ok.all(1).mean()),
        "mean_abs_bin_error": float(err.mean()),
        "within_15_bins": float((err <= 15).mean()),
    }


def _same_instruction_batches(examples: Sequence[Example], batch_size: int):
    by_instruction: dict[str, list[Example]] = {}
    for ex in examples:
        by_instruction.setdefault(ex.instruction, []).append(ex)
    for group in by_instruction.values():
        for s in range(0, len(group), batch_size):
            yield group[s : s + batch_size]


def action_features(vla, examples: Sequence[Example], batch_size: int = 64) -> np.ndarray:
    """Mean lm_head input over the 7 action positions [len(examples), D], teacher-forcing each
    example's tokens (the database's `feat`, docs/design.md §4), in input order."""
    out = []
    with torch.inference_mode():
        for s in range(0, len(examples), batch_size):
            batch = list(examples[s : s + batch_size])
            groups: dict[str, list[int]] = {}
            for i, ex in enumerate(batch):
                groups.setdefault(ex.instruction, []).append(i)
            feats = np.empty((len(batch), vla.hidden_size), np.float32)
            for idx in groups.values():
                hidden, _, p = teacher_forced(vla, [batch[i] for i in idx])
                feats[idx] = hidden[:, p - 1 : p - 1 + ACTION_DIM].float().mean(1).cpu().numpy()
            out.append(feats)
    return np.concatenate(out) if out else np.zeros((0, vla.hidden_size), np.float32)


def episode_points(vla, stats: NormStats, episode: DemoEpisode, batch_size: int = 64,
                   query_views: int = len(VIEWS)) -> list:
    """DemoPoints of one episode: obs from the first `query_views` views (`embed_views`, exactly
    the live query), feat / feat_prev by teacher-forcing the demo's own action tokens, the payload
    of docs/design.md §4."""
    from heisd_ros.store.schema import DemoPoint

    tokens = episode_tokens(vla, stats, episode.actions)
    gap = finger_gaps(episode)
    queries, examples = [], []
    with torch.inference_mode():
        for t in range(episode.length):
            views = episode.views(t, VIEWS[: max(query_views, vla.prompt_views)])
            query, patches = embed_views(vla, views, query_views=query_views)
            queries.append(query)
            examples.append(Example([], episode.instruction, tokens[t], prompt_patches(vla, patches),
                                    episode.ee_pos[t], gap[t]))
    feats = action_features(vla, examples, batch_size)
    points = []
    for t in range(episode.length):
        points.append(DemoPoint(
            dataset=episode.dataset, task=episode.task, instruction=episode.instruction, episode=episode.episode,
            step=t, obs=queries[t], feat=feats[t], feat_prev=feats[max(t - 1, 0)],
            action=stats.unnormalise(vla.action_tokenizer.decode(tokens[t])),
            action_tokens=tuple(int(x) for x in tokens[t]), ee_pos=episode.ee_pos[t],
            next_actions=episode.actions[t + 1 : t + 4], success=episode.success,
        ))
    return points


def held_out_sources(model_dir: str | Path) -> set[str]:
    """`EpisodeRef.source` of the episodes the model held out in training (its train_log.json);
    empty when the directory has no such log."""
    log_path = Path(model_dir) / "train_log.json"
    if not log_path.is_file():
        return set()
    try:
        return set(read_json(log_path, ModelLoadError).get("episodes", {}).get("held_out_sources", []))
    except (OSError, json.JSONDecodeError, AttributeError, TypeError) as err:
        raise ModelLoadError(f"corrupt training log {log_path}: {err}") from err


def held_out_split(refs: Sequence[EpisodeRef], model_dir: str | Path, val_fraction: float, seed: int):
    """(train, held-out) refs: the episodes `train_log.json` of the model held out when it exists
    (so the drafter and its acceptance figures never see the VLA's held-out episodes), else a
    fresh seeded split."""
    from heisd_ros.pipeline.episodes import split_episodes

    held = held_out_sources(model_dir)
    if held:
        val = [r for r in refs if r.source in held]
        return [r for r in refs if r not in val], val
    return split_episodes(refs, val_fraction, seed)


def collect_refs(demos: str = "", bags: str = "", dataset: str = "", tasks: Sequence[int] | None = None) -> list[EpisodeRef]:
    """Episodes of LIBERO HDF5 files (`demos`, optionally only task indices `tasks`) and rosbag2
    recordings (`bags`), named as `heisd build-db` names them: dataset = `dataset`, else the HDF5
    'suite' attribute, else '<parent of the bags dir>_bags'."""
    from heisd_ros.pipeline.episodes import scan_hdf5
    from heisd_ros.pipeline.teleop_bags import scan_bags

    refs: list[EpisodeRef] = []
    if demos:
        refs += [dataclasses.replace(r, dataset=dataset) if dataset else r for r in scan_hdf5(demos, tasks)]
    if bags:
        refs += scan_bags(bags, dataset or f"{Path(bags).resolve().parent.name}_bags")
    return refs


DIGEST_FILES = ("config.json", "dataset_statistics.json", "model.safetensors", "state_prior.json",
                "state_prior.safetensors", SHARD_INDEX, "preprocessor_config.json")
"""The files of a model directory `model_digest` reads (where present), then an OpenVLA
checkpoint's weight shards (those its index names, by file name)."""


def model_digest(model_dir: str | Path) -> str:
    """sha256 (first 16 hex) of a saved model's config, statistics and weights, one file or
    sharded (and its state prior, which changes the greedy decodes cached under this digest)."""
    d = Path(model_dir)
    h = hashlib.sha256()
    for name in DIGEST_FILES:
        if (d / name).is_file():
            hash_file(d / name, h)
    if (d / SHARD_INDEX).is_file():
        shards = read_json(d / SHARD_INDEX, ModelLoadError).get("weight_map", {}).values()
        for name in sorted(set(shards)):
            hash_file(d / name, h)
    return h.hexdigest()[:16]


class GreedyCache:
    """The VLA's own greedy decode of every step of an episode, kept on disk per model:
    `<directory>/greedy_<model digest>/<episode key>.npz` with tokens [T, 7] and f_live [T, D].
    train-drafter (its relabelled targets) and calibrate (live features) share it.
    `state_prior`: the state prior of `model_dir` (its files are part of the digest), so the
    decodes are the tokens the engine executes. `center_crop`: the model was loaded with
    OpenVLA's centre crop (its decodes differ from the uncropped model's)."""

    def __init__(self, directory: str | Path, vla, model_dir: str | Path, batch_size: int = 64,
                 state_prior: ActionPrior | None = None, center_crop: bool = False) -> None:
        self.vla = vla
        crop = "_crop" if center_crop else ""
        self.dir = Path(directory) / f"greedy_{model_digest(model_dir)}{crop}{_dtype_suffix(vla)}"
        self.batch_size = batch_size
        self.state_prior = state_prior

    def get(self, ref: EpisodeRef, examples: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
        p = self.dir / f"{ref.key}.npz"
        if p.is_file():
            with np.load(p) as z:
                if len(z["tokens"]) == len(examples):
                    return z["tokens"], z["f_live"]
        tokens, feats = greedy_decode(self.vla, list(examples), batch_size=self.batch_size, use_cache=True,
                                      state_prior=self.state_prior)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp.npz")
        np.savez(tmp, tokens=tokens, f_live=feats)
        tmp.replace(p)
        return tokens, feats


def own_examples(vla, refs: Sequence[EpisodeRef], cache: FeatureCache, greedy: GreedyCache, desc: str,
                 progress: bool = True) -> tuple[list[Example], list[np.ndarray]]:
    """Examples relabelled with the VLA's greedy tokens, and f_live per episode, for `refs`."""
    stats = vla.stats()
    out: list[Example] = []
    live: list[np.ndarray] = []
    bar = progress_bar(len(refs), desc, progress)
    for r in refs:
        examples = episode_examples(vla, stats, r, cache)
        tokens, feats = greedy.get(r, examples)
        out += [dataclasses.replace(ex, tokens=tokens[t]) for t, ex in enumerate(examples)]
        live.append(feats)
        bar.update(1)
    bar.close()
    return out, live
