"""Shadow records through a rosbag2 recording: written as the node publishes them, read back as episodes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heisd_ros.core.errors import BagError
from heisd_ros.core.shadow import ShadowHit, ShadowStep
from heisd_ros.pipeline.bags import BagWriter, header
from heisd_ros.pipeline.shadow_bags import MSGTYPE, bag_digest, read_shadow_bags, shadow_fields

TOPIC = "/policy_node/shadow"
ARRAYS = {"executed_tokens": np.uint32, "hit_tokens": np.uint32, "hit_scores": np.float32,
          "hit_distance_m": np.float32, "hit_similarity": np.float32, "hit_gripper_switch_in": np.uint8,
          "tree_tokens": np.uint32}  # fmt: skip


def _record(t: int) -> ShadowStep:
    hits = tuple(ShadowHit(score=0.9 - 0.1 * k, tokens=(100 + k, 101, 102, 128, 128, 128, 255), distance_m=0.01 * k,
                           similarity=tuple(0.99 - 0.01 * j for j in range(min(t, 4))), gripper_switch_in=k)
                 for k in range(3))  # fmt: skip
    return ShadowStep(fused_metric=math.nan if t < 2 else 0.5, executed_tokens=(100, 101, 102, 128, 128, 128, 255),
                      hits=hits, drafter_forwards=3, tree_forwards=1, tree_tokens=hits[0].tokens, vision_ms=5.0,
                      retrieval_ms=0.5, drafter_ms=20.0, tree_ms=9.0)  # fmt: skip


def _write(path, episodes: dict[int, list[ShadowStep]], mangle=None, step_ids=None) -> None:
    with BagWriter(path) as bag:
        bag.add(TOPIC, MSGTYPE)
        cls = bag.ts.types[MSGTYPE]
        t_ns = 1_000_000_000
        for episode, records in episodes.items():
            for i, r in enumerate(records):
                step_id = step_ids[i] if step_ids else i + 1
                fields = shadow_fields(r, step_id=step_id, episode=episode, instruction="pick", executed_ms=40.0)
                if mangle:
                    mangle(fields)
                fields = {k: np.asarray(v, dtype=ARRAYS[k]) if k in ARRAYS else v for k, v in fields.items()}
                bag.write(TOPIC, t_ns, cls(header=header(t_ns, "base_link"), **fields))
                t_ns += 100_000_000


def test_records_survive_the_bag_grouped_by_episode(tmp_path):
    episodes = {1: [_record(t) for t in range(5)], 2: [_record(t) for t in range(3)]}
    _write(tmp_path / "shadow", episodes)
    (first, second) = read_shadow_bags([tmp_path / "shadow"])
    assert [len(first.steps), len(second.steps)] == [5, 3] and first.instruction == "pick"
    assert first.executed_ms == [40.0] * 5
    for got, want in zip(first.steps, episodes[1]):
        assert got.executed_tokens == want.executed_tokens and got.tree_tokens == want.tree_tokens
        assert math.isnan(got.fused_metric) == math.isnan(want.fused_metric)
        for g, w in zip(got.hits, want.hits):
            assert g.tokens == w.tokens and g.gripper_switch_in == w.gripper_switch_in
            assert g.similarity == pytest.approx(w.similarity, abs=1e-6)  # float32 on the wire; padding dropped
        assert (got.drafter_forwards, got.tree_forwards, got.tree_ms) == (3, 1, 9.0)


def test_a_malformed_record_fails_the_read_with_the_reason(tmp_path):
    _write(tmp_path / "bad", {1: [_record(3)]}, mangle=lambda f: f.update(hit_scores=f["hit_scores"][:1]))
    with pytest.raises(BagError, match="inconsistent lengths for top_k 3"):
        read_shadow_bags([tmp_path / "bad"])


def test_choose_point_writes_the_point_chosen_from_shadow_recordings(tmp_path, capsys):
    import json
    from pathlib import Path

    from heisd_ros.tools import choose_point

    calibration = Path(__file__).resolve().parents[2] / "models" / "mini_libero" / "calibration.json"
    _write(tmp_path / "shadow", {e: [_record(t) for t in range(8)] for e in range(3)})
    out = tmp_path / "point.json"
    argv = ["--shadow", str(tmp_path / "shadow"), "--calibration", str(calibration), "--out", str(out)]
    assert choose_point.main(argv + ["--min-episodes", "3", "--min-steps", "24"]) == 0
    point = json.loads(out.read_text())
    assert point["chosen_from"]["kind"] == "shadow_recordings"
    assert point["chosen_from"]["bag_digests"] == [bag_digest(tmp_path / "shadow")] != ["missing"]
    chosen = point["meta"]["chosen_point"]
    assert chosen["episodes"] == 3 and chosen["steps"] == 24 and chosen["chosen"] in chosen["candidates"]
    assert "expected" in capsys.readouterr().out and "boundary_off" not in chosen  # the shipped point: tau 0
    # a point with the boundary on reports what tau costs beside the choice (never a candidate)
    bounded = json.loads(calibration.read_text())
    bounded["fused_metric"]["tau"] = 0.9
    (tmp_path / "bounded.json").write_text(json.dumps(bounded))
    argv_b = ["--shadow", str(tmp_path / "shadow"), "--calibration", str(tmp_path / "bounded.json"), "--out", str(out)]
    assert choose_point.main(argv_b + ["--min-episodes", "3", "--min-steps", "24"]) == 0
    off = json.loads(out.read_text())["meta"]["chosen_point"]["boundary_off"]
    assert off["calibration_tau"] == 0.9 and off["steps"] == 24 and "boundary_off" in capsys.readouterr().out
    assert json.loads(out.read_text())["fused_metric"]["tau"] == 0.9  # the choice keeps the calibration's tau
    # the default rule needs more than three short episodes: refused with the reason, nothing written
    out.unlink()
    assert choose_point.main(argv) == 2 and not out.exists()
    assert "the rule needs at least 10 episodes" in capsys.readouterr().err


def test_steps_that_were_not_shadowed_split_an_episode_into_runs_replayed_apart(tmp_path):
    # slack mode passed over steps 4 and 5: the sequence a replay carries (consecutive skips, the
    # live feature's lag, the source costs) breaks there, so the episode comes back as two runs
    _write(tmp_path / "gaps", {7: [_record(t) for t in range(6)]}, step_ids=[1, 2, 3, 6, 7, 8])
    runs = read_shadow_bags([tmp_path / "gaps"])
    assert [len(r.steps) for r in runs] == [3, 3]
    assert runs[0].source == runs[1].source == f"{tmp_path / 'gaps'}#7"  # one recorded episode


def test_a_bag_digest_changes_with_its_records(tmp_path):
    _write(tmp_path / "a", {1: [_record(t) for t in range(3)]})
    _write(tmp_path / "b", {1: [_record(t) for t in range(4)]})
    assert bag_digest(tmp_path / "a") == bag_digest(tmp_path / "a") != bag_digest(tmp_path / "b")
