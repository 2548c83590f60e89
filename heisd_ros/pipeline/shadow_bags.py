"""Shadow records on the wire and in bags: `heisd_ros/ShadowStep` <-> `core.shadow.ShadowStep`.

The node publishes one ShadowStep per executed step it shadowed (`shadow_fields` gives the message
fields, ROS-free); `ros2 bag record` keeps them; `read_shadow_bags` turns the recordings back into
episodes for `heisd choose-point --shadow` (rosbags, no rclpy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from heisd_ros.core.errors import BagError
from heisd_ros.core.shadow import LIVE_LAGS, ShadowHit, ShadowStep
from heisd_ros.core.types import ACTION_DIM
from heisd_ros.pipeline.shadow_point import RecordedEpisode

MSGTYPE = "heisd_ros/msg/ShadowStep"


def shadow_fields(step: ShadowStep, step_id: int, episode: int, instruction: str, executed_ms: float) -> dict[str, Any]:
    """The ShadowStep message's fields (all but the header) of one record."""
    sims = [list(h.similarity) + [math.nan] * (LIVE_LAGS - len(h.similarity)) for h in step.hits]
    return {
        "step_id": int(step_id), "episode": int(episode), "instruction": instruction,
        "fused_metric": float(step.fused_metric), "executed_tokens": [int(t) for t in step.executed_tokens],
        "top_k": len(step.hits), "hit_tokens": [int(t) for h in step.hits for t in h.tokens],
        "hit_scores": [float(h.score) for h in step.hits], "hit_distance_m": [float(h.distance_m) for h in step.hits],
        "hit_similarity": [float(v) for s in sims for v in s],
        "hit_gripper_switch_in": [int(h.gripper_switch_in) for h in step.hits],
        "drafter_forwards": int(step.drafter_forwards), "tree_forwards": int(step.tree_forwards),
        "tree_tokens": [int(t) for t in step.tree_tokens], "fallback": step.fallback,
        "executed_ms": float(executed_ms), "vision_ms": float(step.vision_ms), "retrieval_ms": float(step.retrieval_ms),
        "drafter_ms": float(step.drafter_ms), "tree_ms": float(step.tree_ms),
    }  # fmt: skip


def from_message(msg: Any) -> tuple[ShadowStep, float]:
    """(the record, the executed step's ms) of a ShadowStep message; BagError if it is malformed."""
    k = int(msg.top_k)
    tokens, scores = list(msg.hit_tokens), list(msg.hit_scores)
    dist, sims, switch = list(msg.hit_distance_m), list(msg.hit_similarity), list(msg.hit_gripper_switch_in)
    if (len(tokens), len(scores), len(dist), len(sims), len(switch)) != (k * ACTION_DIM, k, k, k * LIVE_LAGS, k) \
            or len(msg.executed_tokens) != ACTION_DIM or len(msg.tree_tokens) not in (0, ACTION_DIM):
        raise BagError(f"a ShadowStep (step {msg.step_id}) has inconsistent lengths for top_k {k}")
    hits = tuple(ShadowHit(score=float(scores[i]), tokens=tuple(int(t) for t in tokens[i * ACTION_DIM:(i + 1) * ACTION_DIM]),
                           distance_m=float(dist[i]),
                           similarity=tuple(float(v) for v in sims[i * LIVE_LAGS:(i + 1) * LIVE_LAGS] if not math.isnan(v)),
                           gripper_switch_in=int(switch[i]))
                 for i in range(k))  # fmt: skip
    step = ShadowStep(fused_metric=float(msg.fused_metric), executed_tokens=tuple(int(t) for t in msg.executed_tokens),
                      hits=hits, drafter_forwards=int(msg.drafter_forwards), tree_forwards=int(msg.tree_forwards),
                      tree_tokens=tuple(int(t) for t in msg.tree_tokens), fallback=msg.fallback,
                      vision_ms=float(msg.vision_ms), retrieval_ms=float(msg.retrieval_ms),
                      drafter_ms=float(msg.drafter_ms), tree_ms=float(msg.tree_ms))  # fmt: skip
    return step, float(msg.executed_ms)


def read_shadow_bags(paths: Iterable[str | Path]) -> list[RecordedEpisode]:
    """The episodes of every bag, in order: a bag's records grouped by their episode counter, and an
    episode with steps that were not shadowed (shadow.when slack) split into its runs of consecutive
    step ids, each replayed on its own (the sequence a replay carries is broken at a gap)."""
    from heisd_ros.pipeline.bags import read_messages

    episodes: list[RecordedEpisode] = []
    for path in paths:
        current: dict[int, list[tuple[int, str, ShadowStep, float]]] = {}
        for record in read_messages(path, msgtypes=[MSGTYPE]):
            step, executed_ms = from_message(record.msg)
            current.setdefault(int(record.msg.episode), []).append(
                (int(record.msg.step_id), record.msg.instruction, step, executed_ms))
        for episode, rows in current.items():
            rows.sort(key=lambda r: r[0])
            runs: list[list] = []
            for row in rows:
                if not runs or row[0] != runs[-1][-1][0] + 1:
                    runs.append([])
                runs[-1].append(row)
            episodes += [RecordedEpisode(run[0][1], [r[2] for r in run], [r[3] for r in run], f"{path}#{episode}")
                         for run in runs]
    return episodes


def bag_digest(path: str | Path) -> str:
    """sha256 of a rosbag2 directory's metadata and storage files (what choose-point --shadow read)."""
    import hashlib

    h = hashlib.sha256()
    files = sorted(p for p in Path(path).iterdir() if p.suffix in (".yaml", ".mcap", ".db3"))
    if not files:
        return "missing"
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
