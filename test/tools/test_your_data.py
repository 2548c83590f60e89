"""docs/your_data.md, end to end: its `heisd` commands, run as written (plus flags that keep them
small), on generated recordings in both formats, then the node's policy from its parameter file.

A rosbag2 teleoperation recording (TwistStamped + Float64 gripper, 1 = open) and a LeRobot v3
dataset (PyAV-encoded cameras) hold the same kind of episodes; a tiny VLA whose action statistics
fit them plays "my_vla". The databases must hold one point per recorded step, with the tokens of
the recorded actions in the policy's convention.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("pyarrow")
pytest.importorskip("av")

import recordings  # noqa: E402  test/pipeline/recordings.py (pytest.ini: pythonpath)

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "your_data.md"
INSTRUCTION = "put the cup on the plate"
T = 8
SMALL = {"build-db": ["--latency-queries", "5", "--no-progress"],
         "train-drafter": ["--steps", "2", "--batch-size", "4", "--engine-steps", "2", "--no-progress"],
         "calibrate": ["--no-progress"]}


def doc_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def doc_commands() -> list[list[str]]:
    """The `heisd ...` commands of the page's bash blocks, continuation lines joined, split as a shell would."""
    out = []
    for block in doc_blocks("bash"):
        for cmd in block.replace("\\\n", " ").splitlines():
            if cmd.startswith("heisd "):
                out.append(shlex.split(cmd))
    return out


def doc_params() -> dict:
    """The page's parameter file as node parameter names -> values."""
    (text,) = doc_blocks("yaml")
    tree = yaml.safe_load(text)["/**"]["ros__parameters"]

    def flat(node: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in node.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    return flat(tree)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict:
    """The recordings and the VLA the page assumes, then every command of the page run in order."""
    from heisd_ros.core.action_tokenizer import NormStats
    from heisd_ros.models.loader import tiny_vla
    from heisd_ros.tools import cli

    rec = recordings
    root = tmp_path_factory.mktemp("your_data")
    bag_demos = [rec.make_demo(s, T) for s in (0, 1)]
    lerobot_demos = [rec.make_demo(s, T) for s in (2, 3)]
    for i, demo in enumerate(bag_demos):
        rec.write_teleop_bag(root / "recordings" / "cup_on_plate" / f"episode_{i:03d}", demo)
    rec.write_lerobot_dataset(root / "my_lerobot_dataset", lerobot_demos, [INSTRUCTION] * 2)
    vla = tiny_vla(hidden_size=32, layers=1, image_size=32)
    everything = np.concatenate([d.actions for d in bag_demos + lerobot_demos])
    vla.norm_stats = {vla.cfg.unnorm_key: NormStats.fit(everything)}  # a VLA trained on such actions
    vla.save_pretrained(root / "my_vla")

    commands = doc_commands()
    assert [c[1] for c in commands] == ["build-db"] * 2 + ["train-drafter"] * 2 + ["calibrate"] * 2
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for argv in commands:
            assert cli.main(argv[1:] + SMALL[argv[1]]) == 0, shlex.join(argv)
    finally:
        os.chdir(cwd)
    return {"root": root, "bags": bag_demos, "lerobot": lerobot_demos}


def _points(db: Path) -> dict[int, list]:
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store

    with make_store(StoreConfig(backend="edge", path=str(db))) as store:
        points = list(store.scroll())
    by_episode: dict[int, list] = {}
    for p in sorted(points, key=lambda p: (p.episode, p.step)):
        by_episode.setdefault(p.episode, []).append(p)
    return by_episode


def _check_database(db: Path, vla, demos: dict[int, object], dataset: str) -> None:
    """One point per recorded step, each with the tokens of the recorded action and its position."""
    stats = vla.stats()
    points = _points(db)
    assert sorted(points) == sorted(demos)
    for episode, demo in demos.items():
        got = points[episode]
        assert [p.step for p in got] == list(range(T))
        expected = vla.action_tokenizer.encode(stats.normalise(demo.actions))
        assert [list(p.action_tokens) for p in got] == expected.tolist()
        np.testing.assert_allclose([p.ee_pos for p in got], demo.ee_pos, atol=1e-6)
        assert {(p.dataset, p.task) for p in got} == {(dataset, INSTRUCTION)}
        # the gripper token is the policy's: the recording's 1 (open) became -1
        assert all((p.action[6] < 0) == (a[6] < 0) for p, a in zip(got, demo.actions))


def test_bag_database_holds_the_recorded_actions(workspace) -> None:
    from heisd_ros.models.loader import load_vla
    from heisd_ros.pipeline.teleop_bags import episode_number

    root = workspace["root"]
    rec_root = root / "recordings"
    demos = {episode_number(rec_root / "cup_on_plate" / f"episode_{i:03d}", rec_root): d
             for i, d in enumerate(workspace["bags"])}
    _check_database(root / "my_db", load_vla(root / "my_vla"), demos, "cup_teleop")


def test_lerobot_database_holds_the_recorded_actions(workspace) -> None:
    from heisd_ros.models.loader import load_vla

    root = workspace["root"]
    demos = dict(enumerate(workspace["lerobot"]))
    _check_database(root / "my_db_lerobot", load_vla(root / "my_vla"), demos, "my_lerobot_dataset")


def test_drafters_and_calibrations_are_written(workspace) -> None:
    import json

    root = workspace["root"]
    for suffix in ("", "_lerobot"):
        assert (root / f"my_drafter{suffix}" / "drafter.safetensors").is_file()
        calib = json.loads((root / f"my_calibration{suffix}.json").read_text())
        assert calib["meta"]["live_features"] > 0  # the live features came from the recordings


def test_the_pages_parameter_file_starts_the_policy(workspace, monkeypatch) -> None:
    """The node's own loader (`load_decoder`) on the page's parameters decodes recorded observations."""
    from heisd_ros.core.types import Observation
    from heisd_ros.ros import decoder_params
    from heisd_ros.ros.node import load_decoder
    from heisd_ros.ros.params import build_config

    monkeypatch.chdir(workspace["root"])
    given = doc_params()
    explicit = {k: v for k, v in given.items() if k.startswith(decoder_params.DECODER_PREFIX)}
    cfg = decoder_params.resolve(build_config(given), explicit)  # what configure does
    assert cfg.decoder.method == "heisd" and cfg.node.db_path == "my_db"
    decoder = load_decoder(cfg)
    demo = workspace["bags"][0]
    modes = []
    for t in range(T):
        obs = Observation({v: demo.frames[v][t] for v in cfg.decoder.views}, INSTRUCTION, demo.ee_pos[t])
        action, stats = decoder.step(obs)
        assert action.shape == (7,) and np.all(np.isfinite(action))
        assert np.all(np.abs(action) <= np.asarray(cfg.node.action_limits))
        modes.append(stats.mode)
    assert "retrieval" in modes or "skip" in modes  # the database was searched
    decoder.store.close()


def _without(argv: list[str], *flags: str) -> list[str]:
    """argv less the given flags and the value each takes (if any)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in flags:
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(a)
    return out


@pytest.mark.parametrize("dropped, message", [
    (("--gripper-range", "--gripper-open-positive"), "sit at 0, the middle of the default range .*--gripper-range 0,1"),
    (("--gripper-open-positive",), "2 of 2 episodes start with the gripper closed.*--gripper-open-positive"),
    (("--twist-linear-scale",), r"do not fit the model's action statistics .*dX spans .* of the steps fall outside"),
])
def test_build_db_refuses_an_undeclared_convention(workspace, dropped, message, capsys, monkeypatch) -> None:
    """The page's bag command without a convention flag it needs: exit 2, the reason, nothing stored."""
    from heisd_ros.tools import cli

    monkeypatch.chdir(workspace["root"])
    argv = _without(doc_commands()[0], *dropped) + ["--out", "refused_db", "--no-progress"]
    assert cli.main(argv[1:]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (workspace["root"] / "refused_db" / "build_db_manifest.json").exists()
