"""Build the tiny policy's artifacts: a trained tiny VLA, its drafter, a demo database, calibration.

Everything comes from the synthetic demonstrations in `heisd_ros.pipeline.synthetic_demos` with
fixed seeds, so tests, `heisd bench --model tiny` and the first demo run the full pipeline in about
a minute without a simulator. Layout of `out_dir`: model/ drafter/ db/ calibration.json manifest.json.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from heisd_ros.pipeline.calibration import calibrate, save_calibration
from heisd_ros.core.action_tokenizer import NormStats
from heisd_ros.core.config import FusedMetricConfig, StoreConfig
from heisd_ros.core.engine import embed_views
from heisd_ros.models.loader import tiny_vla
from heisd_ros.pipeline import synthetic_demos
from heisd_ros.pipeline.training import Example, teacher_forced, train_drafter, train_vla, greedy_tokens

log = logging.getLogger(__name__)
VERSION = 3
DEFAULTS = dict(seed=0, n_episodes=8, n_steps=40, vla_steps=800, drafter_steps=400)


def synthetic_actions(traj: np.ndarray) -> np.ndarray:
    """Raw 7-D actions for a trajectory [T, 3]: scaled position deltas; no wrist rotation during
    the transport, a slow twist during the fine approach (as in pick-and-place); the gripper
    closes for the approach."""
    delta = np.diff(traj, axis=0, append=traj[-1:]) / 0.02
    n_line = int(len(traj) * 0.7)
    progress = np.clip((np.arange(len(traj)) - n_line + 1) / max(len(traj) - n_line, 1), 0.0, 1.0)
    rot = 0.3 * np.stack([np.sin(np.pi * progress), 0.5 * progress, -np.sin(0.5 * np.pi * progress)], axis=1)
    grip = np.where(np.arange(len(traj)) < n_line, -1.0, 1.0)[:, None]
    return np.concatenate([delta, rot, grip], axis=1)


def _demos(seed: int, n_episodes: int, n_steps: int, image_size: int):
    steps = list(synthetic_demos.episodes(seed, n_episodes, n_steps, image_size))
    by_episode: dict[tuple[str, int], list] = {}
    for s in steps:
        by_episode.setdefault((s.instruction, s.episode), []).append(s)
    actions = {}
    for key, eps in by_episode.items():
        actions[key] = synthetic_actions(np.stack([s.ee_pos for s in eps]))
    return by_episode, actions


def build_tiny_artifacts(out_dir: str | Path, progress: Callable[[str], None] | None = None, **overrides) -> Path:
    """Train and save everything under `out_dir`; an existing build of this VERSION is reused
    (when `overrides` are given, only if it was built with the same parameters)."""
    params = {**DEFAULTS, **overrides}
    out = Path(out_dir)
    manifest = out / "manifest.json"
    if manifest.is_file():
        built = json.loads(manifest.read_text()).get("params", {})
        # Reuse a build of this version; with explicit overrides its parameters must also match.
        if built.get("version") == VERSION and (not overrides or built == {**params, "version": VERSION}):
            return out
    say = progress or (lambda msg: log.info(msg))
    t0 = time.perf_counter()
    torch.manual_seed(params["seed"])
    vla = tiny_vla(seed=params["seed"])
    by_episode, actions = _demos(params["seed"], params["n_episodes"], params["n_steps"], vla.cfg.image_size)
    stats = NormStats.fit(np.concatenate(list(actions.values())))
    vla.norm_stats = {vla.cfg.unnorm_key: stats}
    examples = []
    for key, eps in by_episode.items():
        tokens = vla.action_tokenizer.encode(stats.normalise(actions[key]))
        examples += [Example([s.images["agentview"], s.images["wrist"]], s.instruction, tokens[i]) for i, s in enumerate(eps)]
    say(f"tiny: training VLA on {len(examples)} synthetic steps")
    train_vla(vla, examples, steps=params["vla_steps"], seed=params["seed"])
    vla.save_pretrained(out / "model")
    say("tiny: training drafter on the VLA's own greedy tokens")
    own = greedy_tokens(vla, examples[::2])
    drafter, _ = train_drafter(vla, own, steps=params["drafter_steps"], seed=params["seed"])
    drafter.save(out / "drafter")
    say("tiny: building the demonstration database")
    points = demo_points(vla, by_episode, actions, stats)
    write_db(points, out / "db")
    live_prev = _live_features(vla, by_episode)
    save_calibration(calibrate(points, FusedMetricConfig(), live_prev=live_prev), out / "calibration.json")
    manifest.write_text(json.dumps({"params": {**params, "version": VERSION}, "seconds": time.perf_counter() - t0}))
    return out


def demo_points(vla, by_episode, actions, stats) -> list:
    """Database points of synthetic episodes: {(instruction, episode): [Observation]} with their
    raw actions {(instruction, episode): [T, 7]}, tokenised with `stats`."""
    from heisd_ros.store.schema import DemoPoint

    points = []
    with torch.inference_mode():
        for (instruction, episode), eps in by_episode.items():
            tokens = vla.action_tokenizer.encode(stats.normalise(actions[(instruction, episode)]))
            batch = [Example([s.images["agentview"]], instruction, tokens[i]) for i, s in enumerate(eps)]
            hidden, _, p = teacher_forced(vla, batch)
            feats = hidden[:, p - 1 : p + 6].float().mean(1).numpy()
            for i, s in enumerate(eps):
                query, _ = embed_views(vla, [s.images["agentview"], s.images["wrist"]])
                nxt = actions[(instruction, episode)][i + 1 : i + 4]
                points.append(DemoPoint(
                    dataset="synthetic", task=instruction, instruction=instruction, episode=episode, step=s.step,
                    obs=query, feat=feats[i], feat_prev=feats[max(i - 1, 0)],
                    action=stats.unnormalise(vla.action_tokenizer.decode(tokens[i])),
                    action_tokens=tuple(int(t) for t in tokens[i]), ee_pos=s.ee_pos, next_actions=nxt, success=True,
                ))
    return points


def _live_features(vla, by_episode) -> dict:
    """{(task, episode, step): the VLA's own live feature at the previous step} (AR decoding)."""
    from heisd_ros.assembly import PolicyParts, assemble_decoders
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.types import Observation

    ar = assemble_decoders(PolicyParts(vla), {"ar": DecoderConfig(method="ar")})["ar"]
    out = {}
    for (instruction, episode), eps in by_episode.items():
        prev = None
        for s in eps:
            if prev is not None:
                out[(instruction, episode, s.step)] = prev
            ar.step(Observation(s.images, instruction, s.ee_pos))
            prev = ar.f_live
    return out


def write_db(points: list, path: Path) -> None:
    """A new embedded database at `path` holding `points`."""
    from heisd_ros.store.factory import make_store

    store = make_store(StoreConfig(backend="edge", path=str(path)), obs_dim=points[0].obs.shape[0],
                       feat_dim=points[0].feat.shape[0], create=True)
    try:
        store.upsert(points)
    finally:
        store.close()
