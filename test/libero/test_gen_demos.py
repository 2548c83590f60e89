"""`heisd-libero gen-demos` argument handling that needs no simulator: reserved init states, seeds, summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_libero import gen_demos
from heisd_libero.gen_demos import GenDemosConfig, Summary, episode_seed


@pytest.mark.parametrize("states", ["0-40", "45", "39,49"])
def test_evaluation_init_states_are_refused(states: str) -> None:
    with pytest.raises(ConfigError, match="reserved for evaluation"):
        gen_demos.main(["--init-states", states, "--out", "/nonexistent/never-written"])


def test_config_validation() -> None:
    GenDemosConfig(init_states=tuple(range(40)))
    with pytest.raises(ConfigError):
        GenDemosConfig(tasks=())
    with pytest.raises(ConfigError):
        GenDemosConfig(max_steps=5)


def test_episode_seeds_are_fixed_and_distinct() -> None:
    seeds = {episode_seed(0, t, k, v) for t in range(3) for k in range(5) for v in range(2)}
    assert len(seeds) == 30
    assert episode_seed(0, 1, 2, 0) == episode_seed(0, 1, 2, 0) != episode_seed(1, 1, 2, 0)


def test_summary_counts_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    s = Summary(path, GenDemosConfig())
    info = {"task_name": "t", "instruction": "i"}
    s.add(0, info, {"init_state": 0, "variant": 0, "success": True, "length": 100, "seconds": 2.0})
    s.add(0, info, {"init_state": 1, "variant": 0, "success": False, "length": 300, "seconds": 4.0})
    data = json.loads(path.read_text())
    task = data["tasks"]["0"]
    assert (task["attempts"], task["successes"], task["mean_length"], task["mean_seconds"]) == (2, 1, 100.0, 3.0)
    assert data["seed"] == 0 and "git_revision" in data and data["config"]["camera_size_px"] == 128
    assert Summary(path, GenDemosConfig()).attempted(0) == {(0, 0), (1, 0)}


def test_signal_stops_between_episodes() -> None:
    import os
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with gen_demos.StopBetweenEpisodes() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested  # the process is still alive: the run stops at the next episode
    assert signal.getsignal(signal.SIGTERM) is before


def test_files_of_disjoint_init_state_ranges_share_a_demo_directory(tmp_path: Path) -> None:
    """Two gen-demos files of one task (init states 0-1 and 2-3): their episode numbers, hence
    database point ids, do not collide once both sit in one directory; a file that already holds
    demos keeps its numbering when resumed with another range."""
    import numpy as np

    from heisd_ros.pipeline.episodes import scan_hdf5
    from heisd_libero.sim.recorder import Episode, Hdf5DemoWriter

    def episode(k: int) -> Episode:
        T = 3
        return Episode(actions=np.zeros((T, 7)), ee_pos=np.zeros((T, 3)), ee_quat=np.tile([0.0, 0, 0, 1], (T, 1)),
                       ee_rot=np.tile(np.eye(3), (T, 1, 1)), gripper_qpos=np.zeros((T, 2)), joint_pos=np.zeros((T, 7)),
                       states=np.zeros((T, 4)),
                       images={v: np.zeros((T, 8, 8, 3), np.uint8) for v in ("agentview", "wrist")},
                       instruction="pick up the ketchup", success=True, init_state_index=k, seed=k)

    attrs = {"instruction": "pick up the ketchup", "suite": "libero_object", "task_index": 4, "task_name": "t"}
    both = tmp_path / "both"
    both.mkdir()
    for name, first in (("a", 0), ("b", 2)):
        path = tmp_path / name / "t_demo.hdf5"
        offset = gen_demos.file_episode_offset(path, first)
        with Hdf5DemoWriter(path, {**attrs, "episode_offset": offset}) as w:
            w.write(episode(first))
            w.write(episode(first + 1))
        (both / f"t_demo_{name}.hdf5").symlink_to(path)
    assert sorted(r.episode for r in scan_hdf5(both)) == [4000, 4001, 4002, 4003]
    assert gen_demos.file_episode_offset(tmp_path / "a" / "t_demo.hdf5", 20) == 0  # keeps its numbering
    assert gen_demos.file_episode_offset(tmp_path / "new" / "t_demo.hdf5", 20) == 20
