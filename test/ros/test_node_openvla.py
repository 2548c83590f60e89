"""The policy node on an OpenVLA checkpoint, end to end: docs/openvla.md's parameter file (one
camera) and its `heisd replay` command, run as written on a tiny checkpoint in the published
layout with the drafter, database and calibration its pipeline commands made. Real rclpy: the
node is started once per method and a demonstration's recording is played into it over topics.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # end to end: an OpenVLA-shaped checkpoint through the node

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
pytest.importorskip("h5py")

DOMAIN_ID = 88
REPO = Path(__file__).resolve().parents[2]
METHODS = ("ar", "drafter", "specvla", "retrieval", "heisd")


def _pipeline():
    """test/tools/test_openvla_pipeline.py, for its workspace builder and the page's text."""
    name = "heisd_test_openvla_pipeline"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "test" / "tools" / "test_openvla_pipeline.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> dict:
    """The page's pipeline commands (but bench), its parameter file, then its replay command."""
    import torch

    from heisd_ros.pipeline.bags import read_messages
    from heisd_ros.tools import replay

    pipe = _pipeline()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("openvla_node")
    try:
        ws = pipe.build_workspace(root, ("train-drafter", "build-db", "calibrate"))
    finally:
        torch.set_num_threads(threads)
    (root / "openvla_policy.yaml").write_text(pipe.doc_param_file())
    (argv,) = [c for c in pipe.doc_commands() if c[1] == "replay"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert replay.main(argv[2:] + ["--domain-id", str(DOMAIN_ID), "--warmup-steps", "2", "--quiet",
                                       "--out", "replayed", "--settle-s", "0.3"]) == 0
    finally:
        os.chdir(cwd)
    outputs: dict[str, list] = {}
    for r in read_messages(root / "replayed"):
        outputs.setdefault(r.topic, []).append(r.msg)
    return {"root": root, "argv": argv, "workspace": ws, "outputs": outputs,
            "summary": json.loads((root / "openvla_replay.json").read_text())}


def test_the_page_replays_every_method_into_the_node(replayed) -> None:
    assert tuple(a for i, a in enumerate(replayed["argv"]) if replayed["argv"][i - 1] == "--method") == METHODS
    rows = replayed["summary"]["methods"]
    assert tuple(rows) == METHODS
    for method, row in rows.items():
        assert row["bag_steps"] == row["decoded_steps"] == row["commands"] == _pipeline().T, (method, row)
        # The started node's ticks before the replay's first frame are waits, not rejected steps.
        assert row["timeouts"] == 0 and not row["rejected"], (method, row)


def test_strict_methods_command_what_ar_commands(replayed) -> None:
    out = replayed["outputs"]

    def actions(method: str) -> np.ndarray:
        return np.array([[*m.delta_position, *m.delta_rotation, m.gripper] for m in out[f"/{method}/arm_command"]])

    ar = actions("ar")
    assert np.all(np.isfinite(ar)) and len(ar) == replayed["summary"]["methods"]["ar"]["commands"]
    for method in ("drafter", "retrieval"):
        np.testing.assert_array_equal(actions(method), ar, err_msg=method)
    assert {m.method for m in out["/heisd/decode_stats"]} == {"heisd"}


def test_heisd_and_retrieval_search_the_checkpoints_database(replayed) -> None:
    rows = replayed["summary"]["methods"]
    assert rows["retrieval"]["mode_mix"].get("retrieval", 0) > 0
    assert set(rows["heisd"]["mode_mix"]) & {"retrieval", "skip"}
    assert rows["drafter"]["forwards_per_step"] <= 7.0
