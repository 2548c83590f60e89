"""Untrusted files: weights only through safetensors (or torch.load(weights_only=True)), no pickle
of downloaded data anywhere, and demonstration HDF5 files validated before they are read."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from heisd_ros.core.errors import DataFileError
from heisd_ros.pipeline.data_checks import check_demo_hdf5

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("heisd_ros", "benchmarks", "scripts", "launch") for p in (REPO / d).rglob("*.py"))


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            yield owner, name, node


def _kw(node: ast.Call, name: str):
    kw = next((k for k in node.keywords if k.arg == name), None)
    return None if kw is None or not isinstance(kw.value, ast.Constant) else kw.value.value


def test_no_unsafe_deserialisation_in_the_code():
    """torch.load only with weights_only=True; no pickle/joblib/np.load(allow_pickle=True)/torch.jit.load."""
    bad = []
    for path in SOURCES:
        for owner, name, node in _calls(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if owner == "torch" and name == "load" and _kw(node, "weights_only") is not True:
                bad.append(f"{where}: torch.load without weights_only=True")
            if owner in ("pickle", "dill", "joblib", "cloudpickle") and name in ("load", "loads"):
                bad.append(f"{where}: {owner}.{name}")
            if owner == "np" and name == "load" and _kw(node, "allow_pickle") is True:
                bad.append(f"{where}: np.load(allow_pickle=True)")
            if owner == "jit" and name == "load":
                bad.append(f"{where}: torch.jit.load")
    assert not bad, "unsafe deserialisation:\n" + "\n".join(bad)
    assert len(SOURCES) > 30  # the scan did see the package


def test_the_scan_catches_what_it_must():
    code = "import torch\ntorch.load('x')\ntorch.load('y', weights_only=False)\ntorch.load('z', weights_only=True)\n"
    found = [n.lineno for o, name, n in _calls(ast.parse(code)) if o == "torch" and _kw(n, "weights_only") is not True]
    assert found == [2, 3]


# --- demonstration HDF5 ---------------------------------------------------------------------------


def _write(path: Path, demos=2, t=4, hw=(8, 8), instruction="pick up the bowl", edit=None) -> Path:
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        if instruction is not None:
            data.attrs["instruction"] = instruction
        for i in range(demos):
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=rng.uniform(-1, 1, (t, 7)))
            g.create_dataset("obs/ee_pos", data=rng.uniform(-0.3, 0.3, (t, 3)))
            for k in ("agentview_rgb", "eye_in_hand_rgb"):
                g.create_dataset(f"obs/{k}", data=rng.integers(0, 255, (t, *hw, 3), dtype=np.uint8), compression="gzip")
        if edit is not None:
            edit(f, path)
    return path


def test_a_valid_file_passes_with_a_summary(tmp_path):
    s = check_demo_hdf5(_write(tmp_path / "ok.hdf5"))
    assert (s.demos, s.steps, s.image_hw, s.instruction) == (2, 8, (8, 8), "pick up the bowl")


def test_a_file_written_by_the_demo_recorder_passes(tmp_path):
    from heisd_ros.sim.recorder import Episode, Hdf5DemoWriter

    t = 5
    ep = Episode(actions=np.zeros((t, 7)), ee_pos=np.zeros((t, 3)), ee_quat=np.tile([0, 0, 0, 1.0], (t, 1)),
                 ee_rot=np.tile(np.eye(3), (t, 1, 1)), gripper_qpos=np.zeros((t, 2)), joint_pos=np.zeros((t, 7)),
                 states=np.zeros((t, 10)), images={v: np.zeros((t, 8, 8, 3), np.uint8) for v in ("agentview", "wrist")},
                 instruction="open the drawer", success=True, init_state_index=0, variant=0, seed=0, perturb_xy_m=0.0)  # fmt: skip
    with Hdf5DemoWriter(tmp_path / "rec.hdf5", {"instruction": "open the drawer"}) as w:
        w.write(ep)
    assert check_demo_hdf5(tmp_path / "rec.hdf5").steps == t


def _set(key, value):
    def edit(f, path):
        del f[key]
        f[key] = value

    return edit


def _external(f, path):
    del f["data/demo_1/obs/ee_pos"]
    f["data/demo_1/obs/ee_pos"] = __import__("h5py").ExternalLink("/etc/passwd", "/x")


BROKEN = {
    "not hdf5": (lambda p: p.write_bytes(b"\x89HDF-not-really" * 10), "not a readable HDF5 file"),
    "truncated": (lambda p: p.write_bytes(_write(p).read_bytes()[:3000]), "not a readable HDF5 file"),
    "no data group": (lambda p: _write(p, edit=lambda f, _: f.move("data", "other")), "no 'data' group"),
    "no instruction": (lambda p: _write(p, instruction=None), "no 'instruction' attribute"),
    "no demos": (lambda p: _write(p, demos=0), "holds no demonstrations"),
    "bad demo name": (lambda p: _write(p, edit=lambda f, _: f.move("data/demo_1", "data/demo_x")), "demo_<i>"),
    "missing actions": (lambda p: _write(p, edit=lambda f, _: f.__delitem__("data/demo_0/actions")), "demo_0/actions: missing"),
    "wrong action shape": (lambda p: _write(p, edit=_set("data/demo_0/actions", np.zeros((4, 6)))), r"expected \[T, 7\]"),
    "text actions": (lambda p: _write(p, edit=_set("data/demo_0/actions", np.array([b"x"] * 4))), "dtype"),
    "nan actions": (lambda p: _write(p, edit=_set("data/demo_1/actions", np.full((4, 7), np.nan))), "NaN"),
    "inf position": (lambda p: _write(p, edit=_set("data/demo_0/obs/ee_pos", np.full((4, 3), np.inf))), "NaN or Inf"),
    "float images": (lambda p: _write(p, edit=_set("data/demo_0/obs/agentview_rgb", np.zeros((4, 8, 8, 3)))), "uint8"),
    "length mismatch": (lambda p: _write(p, edit=_set("data/demo_0/obs/ee_pos", np.zeros((3, 3)))), "disagree"),
    "image sizes differ": (lambda p: _write(p, edit=_set("data/demo_1/obs/eye_in_hand_rgb",
                                                         np.zeros((4, 9, 8, 3), np.uint8))), "differs"),
    "external link": (lambda p: _write(p, edit=_external), "ExternalLink"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_files_are_refused_naming_file_and_dataset(tmp_path, case):
    make, words = BROKEN[case]
    path = tmp_path / "demo.hdf5"
    make(path)
    with pytest.raises(DataFileError, match=words) as info:
        check_demo_hdf5(path)
    assert str(path) in str(info.value)


def test_demo_scan_checks_every_file_before_reading(tmp_path):
    """scan_hdf5 (train-vla, build-db, calibrate read through it) refuses a damaged file by name,
    or skips it with a warning when only some tasks were asked for."""
    from heisd_ros.pipeline.episodes import DemoDataError, scan_hdf5

    def nan_action(f, _path):
        f["data/demo_1/actions"][2, 3] = np.nan

    d = tmp_path / "demos"
    d.mkdir()
    _write(d / "a_demo.hdf5")
    _write(d / "b_demo.hdf5", edit=nan_action)
    with pytest.raises(DemoDataError, match="b_demo.hdf5.*NaN"):
        scan_hdf5(d)
    refs = scan_hdf5(d, tasks=[0, 1])
    assert {Path(r.path).name for r in refs} == {"a_demo.hdf5"} and len(refs) == 2
