"""Untrusted files: weights only through safetensors (or torch.load(weights_only=True)), no pickle
of downloaded data anywhere, demonstration HDF5 files validated before they are read (declared
dataset sizes included), and every JSON or YAML file a tool reads whole size-checked first."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from heisd_ros.core.errors import BagError, DataFileError, HeisdError
from heisd_ros.core.files import MAX_JSON_BYTES
from heisd_ros.pipeline.data_checks import MAX_DATASET_BYTES, MAX_IMAGE_PIXELS, MAX_STEPS_PER_DEMO, check_demo_hdf5

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("heisd_ros", "heisd_libero", "benchmarks", "scripts", "launch") for p in (REPO / d).rglob("*.py"))


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
    recorder = pytest.importorskip("heisd_libero.sim.recorder", reason="the LIBERO workbench's recorder")
    Episode, Hdf5DemoWriter = recorder.Episode, recorder.Hdf5DemoWriter

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


def _declared(key, shape, dtype="float64", **kwargs):
    """Replace dataset `key` by one that declares `shape` and holds no data (a file of kilobytes)."""
    def edit(f, path):
        del f[key]
        f.create_dataset(key, shape=shape, dtype=dtype, **kwargs)

    return edit


def _huge_demo(f, path):
    """Every dataset of demo_0 declared at 1000 steps of 2048x2048 images: within the step and pixel
    limits, 12.6 GB an image stream, all of it fill values."""
    for key, shape, dtype in (("actions", (1000, 7), "float64"), ("obs/ee_pos", (1000, 3), "float64"),
                              ("obs/agentview_rgb", (1000, 2048, 2048, 3), "uint8"),
                              ("obs/eye_in_hand_rgb", (1000, 2048, 2048, 3), "uint8")):
        _declared(f"data/demo_0/{key}", shape, dtype, chunks=True)(f, path)


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
    "huge declared images": (lambda p: _write(p, edit=_huge_demo), "demo_0/obs/agentview_rgb: declares 12582912000 bytes"),
    "huge declared extra dataset": (lambda p: _write(p, edit=lambda f, _: f.create_dataset(
        "data/demo_1/obs/gripper_states", shape=(10**15, 2), dtype="float64", chunks=True)), "gripper_states: declares"),
    "huge chunk": (lambda p: _write(p, edit=lambda f, _: f.create_dataset(
        "data/demo_0/dones", shape=(4,), maxshape=(None,), chunks=(3 << 30,), dtype="uint8")), "dones: declares 3221225472"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_files_are_refused_naming_file_and_dataset(tmp_path, case):
    make, words = BROKEN[case]
    path = tmp_path / "demo.hdf5"
    make(path)
    with pytest.raises(DataFileError, match=words) as info:
        check_demo_hdf5(path)
    assert str(path) in str(info.value)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 2 * MAX_STEPS_PER_DEMO), h=st.integers(1, 6000), w=st.integers(1, 6000))
@example(t=43_691, h=128, w=128)  # 2147516416 bytes: just over the cap
@example(t=43_690, h=128, w=128)  # 2147467264 bytes: just under it
def test_a_file_passes_only_when_what_it_declares_fits(tmp_path_factory, t, h, w):
    """Whatever shapes a file declares (no data written), the check accepts it exactly when the
    steps, the pixels and every dataset's declared bytes are within their limits, and reads no
    more than the actions and positions (t x 10 numbers) to decide."""
    path = tmp_path_factory.mktemp("declared") / "demo.hdf5"
    views = {"obs/agentview_rgb": (t, h, w, 3), "obs/eye_in_hand_rgb": (t, h, w, 3)}
    declared = {"actions": (t, 7), "obs/ee_pos": (t, 3), **views}

    def declare(f, _path):
        for key, shape in declared.items():
            _declared(f"data/demo_0/{key}", shape, "uint8" if key in views else "float64", chunks=True)(f, _path)

    _write(path, demos=1, edit=declare)
    fits = t <= MAX_STEPS_PER_DEMO and h * w <= MAX_IMAGE_PIXELS and t * h * w * 3 <= MAX_DATASET_BYTES
    try:
        check_demo_hdf5(path)
    except DataFileError as err:
        assert not fits and str(path) in str(err), err
    else:
        assert fits


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


# --- JSON and YAML read whole ------------------------------------------------------------------


def _sparse(path: Path, size: int = MAX_JSON_BYTES + 1) -> Path:
    """A file of `size` bytes that takes no disk space: one byte over the cap by default."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)
    return path


def _point(d: Path):
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.pipeline.calibration import apply_calibration

    return apply_calibration(DecoderConfig(), _sparse(d / "point.json"))


def _config_yaml(d: Path):
    from heisd_ros.core.config import DecoderConfig, load_yaml

    return load_yaml(DecoderConfig, _sparse(d / "policy.yaml"))


def _model_config(d: Path):
    from heisd_ros.models.loader import load_vla

    _sparse(d / "config.json")
    return load_vla(d)


def _statistics(d: Path):
    from heisd_ros.core.action_tokenizer import load_dataset_statistics

    return load_dataset_statistics(_sparse(d / "dataset_statistics.json"))


def _state_prior(d: Path):
    from heisd_ros.models.state_prior import CONFIG_FILE, load_state_prior

    _sparse(d / CONFIG_FILE)
    return load_state_prior(d)


def _openvla_config(d: Path):
    from heisd_ros.models.openvla import check_checkpoint_dir

    _sparse(d / "config.json")
    return check_checkpoint_dir(d)


def _shard_index(d: Path):
    from heisd_ros.models.openvla_weights import INDEX_FILE, read_layout

    _sparse(d / INDEX_FILE)
    return read_layout(d)


def _tokenizer(d: Path):
    from heisd_ros.models.openvla_tokenizer import TOKENIZER_FILE, LlamaPromptTokenizer

    _sparse(d / TOKENIZER_FILE)
    return LlamaPromptTokenizer(d)


def _training_log(d: Path):
    from heisd_ros.pipeline.features import held_out_sources

    _sparse(d / "train_log.json")
    return held_out_sources(d)


def _manifest(d: Path):
    from heisd_ros.store.manifest import MANIFEST, read_manifest

    _sparse(d / MANIFEST)
    return read_manifest(d)


def _lerobot_info(d: Path):
    from heisd_ros.pipeline.lerobot_dataset import LeRobotLayout

    _sparse(d / "meta" / "info.json")
    return LeRobotLayout(d)


def _bag_metadata(d: Path):
    from heisd_ros.pipeline.bags import topic_counts

    _sparse(d / "metadata.yaml")
    return topic_counts(d)


def _eval_report(d: Path):
    from heisd_ros.tools.choose_point import PointRule, run

    return run(str(_sparse(d / "run.json")), str(d / "point.json"), str(d / "out.json"), PointRule())


WHOLE_FILES = {
    "operating-point file": (_point, "CalibrationError", "point.json"),
    "configuration YAML": (_config_yaml, "ConfigError", "policy.yaml"),
    "model config.json": (_model_config, "ModelLoadError", "config.json"),
    "dataset_statistics.json": (_statistics, "ModelLoadError", "dataset_statistics.json"),
    "state prior config": (_state_prior, "ModelLoadError", "state_prior.json"),
    "OpenVLA config.json": (_openvla_config, "ModelLoadError", "config.json"),
    "sharded checkpoint index": (_shard_index, "ModelLoadError", "model.safetensors.index.json"),
    "tokenizer.json": (_tokenizer, "ModelLoadError", "tokenizer.json"),
    "training log": (_training_log, "ModelLoadError", "train_log.json"),
    "build-db manifest": (_manifest, "DatabaseError", "build_db_manifest.json"),
    "LeRobot info.json": (_lerobot_info, "DemoDataError", "info.json"),
    "bag metadata.yaml": (_bag_metadata, "BagError", "metadata.yaml"),
    "evaluation report": (_eval_report, "ConfigError", "run.json"),
}


@pytest.mark.parametrize("case", list(WHOLE_FILES))
def test_a_file_read_whole_is_refused_over_the_cap_before_it_is_read(tmp_path, case):
    """One byte over MAX_JSON_BYTES (a sparse file): the reader's own error names the file and its
    size; before, the reader read all of it (whatever its size) and failed on the zeros, or not."""
    read, error, name = WHOLE_FILES[case]
    with pytest.raises(HeisdError) as info:
        read(tmp_path)
    assert type(info.value).__name__ == error
    assert f"{name} is {MAX_JSON_BYTES + 1} bytes" in str(info.value) and str(tmp_path) in str(info.value)


def test_a_verify_skip_state_file_over_the_cap_is_ignored_like_a_corrupt_one(tmp_path, caplog):
    from heisd_ros.core.config import VerifySkipConfig
    from heisd_ros.core.verify_skip import VerifySkipPolicy

    cfg = VerifySkipConfig(state_path=str(_sparse(tmp_path / "skip_state.json")), online=True)
    with caplog.at_level(logging.WARNING, logger="heisd_ros.core.verify_skip"):
        policy = VerifySkipPolicy(cfg)
    assert (policy.min_similarity, policy.max_distance_m) == (cfg.min_similarity, cfg.max_distance_m)
    assert any("skip_state.json is" in r.getMessage() for r in caplog.records)


def test_a_bag_whose_metadata_is_over_the_cap_is_refused_before_rosbags_reads_it(tmp_path):
    from heisd_ros.pipeline.bags import read_messages

    _sparse(tmp_path / "bag" / "metadata.yaml")
    with pytest.raises(BagError, match=f"metadata.yaml is {MAX_JSON_BYTES + 1} bytes"):
        list(read_messages(tmp_path / "bag"))


def test_an_episode_read_checks_every_declared_size_again(tmp_path):
    """The file may change between scanning and reading (build-db reads hours later): the read
    refuses a dataset declaring more than MAX_DATASET_BYTES by file and dataset, and allocates
    nothing (before: MemoryError, or the machine's memory filled with fill values)."""
    import h5py

    from heisd_ros.pipeline.episodes import DemoDataError, load_hdf5_episode, scan_hdf5

    path = _write(tmp_path / "demo.hdf5")
    ref = next(r for r in scan_hdf5(path) if r.demo == "demo_1")
    with h5py.File(path, "a") as f:
        f.create_dataset("data/demo_1/obs/gripper_states", shape=(10**15, 2), dtype="float64", chunks=True)
    with pytest.raises(DemoDataError, match=r"demo\.hdf5:/data/demo_1/obs/gripper_states: declares 16000000000000000 bytes"):
        load_hdf5_episode(ref)
    with pytest.raises(DemoDataError, match="gripper_states: declares"):
        scan_hdf5(path)  # and a scan now refuses the file


def test_the_recorders_reader_checks_every_declared_size(tmp_path):
    import h5py

    recorder = pytest.importorskip("heisd_libero.sim.recorder", reason="the LIBERO workbench's recorder")
    DemoFileError, Episode, Hdf5DemoWriter = recorder.DemoFileError, recorder.Episode, recorder.Hdf5DemoWriter
    read_hdf5_demos = recorder.read_hdf5_demos

    t = 3
    ep = Episode(actions=np.zeros((t, 7)), ee_pos=np.zeros((t, 3)), ee_quat=np.tile([0, 0, 0, 1.0], (t, 1)),
                 ee_rot=np.tile(np.eye(3), (t, 1, 1)), gripper_qpos=np.zeros((t, 2)), joint_pos=np.zeros((t, 7)),
                 states=np.zeros((t, 10)), images={v: np.zeros((t, 8, 8, 3), np.uint8) for v in ("agentview", "wrist")},
                 instruction="open the drawer", success=True, init_state_index=0, variant=0, seed=0, perturb_xy_m=0.0)  # fmt: skip
    with Hdf5DemoWriter(tmp_path / "rec.hdf5", {"instruction": "open the drawer"}) as w:
        w.write(ep)
    assert len(read_hdf5_demos(tmp_path / "rec.hdf5")[1]) == 1
    with h5py.File(tmp_path / "rec.hdf5", "a") as f:
        del f["data/demo_0/states"]
        f.create_dataset("data/demo_0/states", shape=(10**12, 10**4), dtype="float64", chunks=True)
    with pytest.raises(DemoFileError, match=r"rec\.hdf5:/data/demo_0/states: declares"):
        read_hdf5_demos(tmp_path / "rec.hdf5")
