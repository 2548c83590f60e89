"""docs/openvla.md "The whole pipeline on your OpenVLA checkpoint", end to end on a tiny
checkpoint in the published layout: its train-drafter, build-db, calibrate and bench commands run
as written (plus flags that keep them small) on LIBERO-layout demonstrations, then what they
wrote is checked with the loaders the node uses. Also: one-camera recordings as sources, the
centre crop and the statistics key as run-time choices, and the caches' keys.

`build_workspace` is shared with test/ros/test_node_openvla.py (imported by path).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # end to end: the OpenVLA tools end to end

pytest.importorskip("h5py")

import recordings  # noqa: E402  test/pipeline/recordings.py (pytest.ini: pythonpath)

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "openvla.md"
SECTION = "## The whole pipeline on your OpenVLA checkpoint"
CHECKPOINT = "openvla-7b-finetuned-libero-spatial"
UNNORM_KEY = "libero_spatial_no_noops"
TASK_NAME = "pick_up_the_black_bowl"
INSTRUCTION = "pick up the black bowl"
T = 8
EPISODES = 3
SMALL = {"train-drafter": ["--steps", "4", "--batch-size", "4", "--engine-steps", "2", "--no-progress"],
         "build-db": ["--latency-queries", "5", "--no-progress"],
         "calibrate": ["--no-progress"],
         "bench": ["--steps", "6", "--warmup", "1"]}
ONE_CAMERA = ("/front_cam/image_raw", "/arm/ee_pose", "/task", "/arm/command")
ONE_CAMERA_MAP = "/front_cam/image_raw=agentview,/arm/ee_pose=pose,/task=instruction,/arm/command=action"


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def doc_commands() -> list[list[str]]:
    """The section's `heisd ...` commands, continuation lines joined, split as a shell would."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section(), flags=re.DOTALL):
        for cmd in block.replace("\\\n", " ").splitlines():
            if cmd.startswith("heisd "):
                out.append(shlex.split(cmd))
    return out


def doc_param_file() -> str:
    (text,) = re.findall(r"```yaml\n(.*?)```", section(), flags=re.DOTALL)
    return text


def _episode(demo, seed: int):
    from heisd_libero.sim.recorder import Episode

    n = len(demo.actions)
    return Episode(actions=demo.actions, ee_pos=demo.ee_pos, ee_quat=np.tile([0.0, 0.0, 0.0, 1.0], (n, 1)),
                   ee_rot=np.tile(np.eye(3), (n, 1, 1)), gripper_qpos=demo.fingers, joint_pos=np.zeros((n, 7)),
                   states=np.zeros((n, 4)), images=dict(demo.frames), instruction=INSTRUCTION, success=True,
                   init_state_index=seed, seed=seed)


def write_sources(root: Path) -> list:
    """LIBERO-layout demonstrations (HDF5 with their node-topic bags, as gen-demos writes them) and
    the same episodes as one-camera recordings on other topics; returns the episodes. They are
    written with the LIBERO workbench's recorder (skipped without it)."""
    from heisd_ros.pipeline.bags import BagTopics

    pytest.importorskip("heisd_libero.sim.recorder", reason="writes the sources with the LIBERO workbench's recorder")
    from heisd_libero.sim.recorder import Hdf5DemoWriter, export_mcap

    rec = recordings
    demos = root / "libero_spatial"
    attrs = {"instruction": INSTRUCTION, "suite": "libero_spatial", "task_index": 0, "task_name": TASK_NAME,
             "problem_info": {}}
    one_camera = BagTopics(images=(("agentview", ONE_CAMERA[0]),), ee_pose=ONE_CAMERA[1], instruction=ONE_CAMERA[2],
                           command=ONE_CAMERA[3])
    episodes = [_episode(rec.make_demo(seed, T, size=64), seed) for seed in range(EPISODES)]
    with Hdf5DemoWriter(demos / f"{TASK_NAME}_demo.hdf5", attrs) as writer:
        for i, ep in enumerate(episodes):
            name = writer.write(ep)
            export_mcap(ep, demos / "bags" / TASK_NAME / name)
            export_mcap(ep, root / "recordings" / f"episode_{i:03d}", one_camera)
    return episodes


def write_checkpoint(directory: Path, episodes: list, keys: tuple[str, ...] = (UNNORM_KEY,)) -> None:
    """The tiny random checkpoint, its action statistics those of a fine-tune on `episodes`."""
    from heisd_ros.core.action_tokenizer import NormStats
    from heisd_ros.models.openvla_random import PRESETS, write_random_checkpoint

    write_random_checkpoint(directory, PRESETS["tiny"])
    stats = NormStats.fit(np.concatenate([ep.actions for ep in episodes])).to_json()
    (directory / "dataset_statistics.json").write_text(json.dumps({k: stats for k in keys}))


def run_commands(root: Path, names: tuple[str, ...]) -> dict[str, float]:
    """Run the section's commands named in `names` in `root`, in the page's order; seconds each."""
    from heisd_ros.tools import cli

    seconds = {}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for argv in doc_commands():
            if argv[1] in names:
                extra = SMALL[argv[1]] + (["--json", "bench.json"] if argv[1] == "bench" else [])
                t0 = time.perf_counter()
                assert cli.main(argv[1:] + extra) == 0, shlex.join(argv)
                seconds[argv[1]] = round(time.perf_counter() - t0, 2)
    finally:
        os.chdir(cwd)
    return seconds


def build_workspace(root: Path, names: tuple[str, ...] = ("train-drafter", "build-db", "calibrate", "bench")) -> dict:
    """Sources, checkpoint and the section's commands run in `root`."""
    import torch

    torch.manual_seed(0)
    episodes = write_sources(root)
    write_checkpoint(root / CHECKPOINT, episodes)
    seconds = run_commands(root, names)
    print(f"openvla pipeline on the tiny checkpoint, seconds: {seconds}")
    return {"root": root, "episodes": episodes, "seconds": seconds}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield build_workspace(tmp_path_factory.mktemp("openvla_pipeline"))
    finally:
        torch.set_num_threads(threads)


def test_the_page_runs_the_tools_in_order() -> None:
    assert [c[1] for c in doc_commands()] == ["train-drafter", "build-db", "calibrate", "bench", "replay"]
    assert all(CHECKPOINT in c for c in doc_commands()[:4])


def _points(db: Path) -> list:
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store

    with make_store(StoreConfig(backend="edge", path=str(db))) as store:
        return sorted(store.scroll(), key=lambda p: (p.episode, p.step))


def test_database_holds_every_step_with_one_view_queries(workspace) -> None:
    from heisd_ros.core.engine import embed_views
    from heisd_ros.models.loader import load_vla

    root = workspace["root"]
    vla = load_vla(root / CHECKPOINT)
    points = _points(root / "openvla_db")
    assert len(points) == EPISODES * T and {p.task for p in points} == {INSTRUCTION}
    manifest = json.loads((root / "openvla_db" / "build_db_manifest.json").read_text())
    assert manifest["query_views"] == 1 and manifest["center_crop"] is False
    tokens = [vla.action_tokenizer.encode(vla.stats().normalise(ep.actions)) for ep in workspace["episodes"]]
    assert [list(p.action_tokens) for p in points] == np.concatenate(tokens).tolist()
    first = workspace["episodes"][0].images["agentview"][0]
    query, _ = embed_views(vla, [first], query_views=1)  # the live query of the node's one camera
    assert points[0].obs.shape == (vla.query_dim,)
    np.testing.assert_allclose(points[0].obs, query, atol=1e-5)


def test_drafter_is_lossless_and_loads_for_the_checkpoint(workspace) -> None:
    from heisd_ros.core.drafter import load_drafter
    from heisd_ros.models.loader import load_vla

    root = workspace["root"]
    log = json.loads((root / "openvla_drafter" / "drafter_log.json").read_text())
    assert log["engine_drafter_held_out"]["lossless_all_steps"] is True
    assert log["steps"]["train"] + log["steps"]["held_out"] == EPISODES * T
    vla = load_vla(root / CHECKPOINT)
    drafter = load_drafter(root / "openvla_drafter", vla.language_model.config)
    assert drafter is not None


def test_calibration_used_live_features_and_applies(workspace) -> None:
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.pipeline.calibration import apply_calibration

    path = workspace["root"] / "openvla_calibration.json"
    calib = json.loads(path.read_text())
    assert calib["meta"]["live_features"] == EPISODES * (T - 1)
    assert apply_calibration(DecoderConfig(), path).fused_metric.tau == calib["fused_metric"]["tau"]


def test_bench_times_every_method_and_the_strict_ones_equal_ar(workspace) -> None:
    report = json.loads((workspace["root"] / "bench.json").read_text())
    from heisd_ros.core.config import METHODS

    assert set(METHODS) <= set(report)
    for method in METHODS:
        assert report[method]["steps"] == 2 * 6, method  # --episodes 2 of the task, --steps 6 each
    for method in ("drafter", "retrieval"):
        assert report[method]["tokens_identical_to_ar"] is True, method
    assert report["retrieval"]["mode_mix"].get("retrieval", 0) > 0  # the database of the demos was searched


def test_feature_cache_is_keyed_by_the_checkpoints_fingerprint(workspace) -> None:
    from heisd_ros.models.loader import load_vla
    from heisd_ros.pipeline.features import model_fingerprint

    root = workspace["root"]
    vla = load_vla(root / CHECKPOINT)
    assert (root / f"{CHECKPOINT}_features" / model_fingerprint(vla)).is_dir()
    cropped = load_vla(root / CHECKPOINT, center_crop=True)
    assert cropped.fingerprint() != vla.fingerprint()  # cropped frames give other features
    assert model_fingerprint(load_vla(root / CHECKPOINT, dtype="bfloat16")).endswith("_bfloat16")


def test_model_digest_reads_every_weight_shard(workspace, tmp_path) -> None:
    import shutil

    from heisd_ros.pipeline.features import model_digest

    src = workspace["root"] / CHECKPOINT
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    assert model_digest(copy) == model_digest(src)
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    shard = copy / sorted(set(index["weight_map"].values()))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one bit of the last shard's last tensor
    shard.write_bytes(bytes(data))
    assert model_digest(copy) != model_digest(src)


def test_heisd_model_fingerprint_keeps_existing_caches() -> None:
    """`VLAModel.fingerprint` is the hash feature caches were stored under before it existed."""
    from heisd_ros.models.loader import tiny_vla

    vla = tiny_vla(hidden_size=32, layers=1)
    cfg = vla.cfg
    h = hashlib.sha256(f"{cfg.vision}:{cfg.image_size}:{cfg.patch_size}".encode())
    for name, t in sorted(vla.vision_backbone.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().numpy().tobytes()[:4096])
    assert vla.fingerprint() == h.hexdigest()[:12]


def test_one_camera_recordings_feed_the_tools(workspace, tmp_path, capsys) -> None:
    """Recordings with one camera on other topics: build-db needs --query-views 1 and says so;
    with it, build-db, train-drafter and calibrate read them."""
    from heisd_ros.tools import cli

    root = workspace["root"]
    model, bags = str(root / CHECKPOINT), str(root / "recordings")
    source = ["--bags", bags, "--map", ONE_CAMERA_MAP, "--cache-dir", str(tmp_path / "cache")]
    db = ["build-db", "--model", model, "--out", str(tmp_path / "db"), "--bags", bags, "--map", ONE_CAMERA_MAP,
          "--latency-queries", "3", "--no-progress"]
    assert cli.main(db) == 2
    assert re.search(r"has no \['wrist'\] view.*--query-views 1", capsys.readouterr().err)
    assert cli.main(db + ["--query-views", "1", "--fresh"]) == 0
    assert len(_points(tmp_path / "db")) == EPISODES * T
    assert cli.main(["train-drafter", "--model", model, "--out", str(tmp_path / "drafter"), *source,
                     *SMALL["train-drafter"]]) == 0
    assert json.loads((tmp_path / "drafter" / "drafter_log.json").read_text())[
        "engine_drafter_held_out"]["lossless_all_steps"]
    assert cli.main(["calibrate", "--model", model, "--db", str(tmp_path / "db"), "--out", str(tmp_path / "c.json"),
                     *source, "--no-progress"]) == 0


def test_center_crop_is_a_run_time_choice_recorded_by_the_database(workspace, tmp_path) -> None:
    from heisd_ros.core.errors import DatabaseError
    from heisd_ros.tools import build_db, calibrate

    root = workspace["root"]
    model, demos = str(root / CHECKPOINT), str(root / "libero_spatial")
    common = ["--model", model, "--demos", demos, "--no-progress"]
    assert build_db.main([*common, "--out", str(tmp_path / "db"), "--query-views", "1", "--center-crop",
                          "--latency-queries", "0"]) == 0
    manifest = json.loads((tmp_path / "db" / "build_db_manifest.json").read_text())
    assert manifest["center_crop"] is True
    plain = {(p.episode, p.step): p.obs for p in _points(root / "openvla_db")}
    cropped = _points(tmp_path / "db")
    assert not np.allclose(cropped[0].obs, plain[(cropped[0].episode, cropped[0].step)])
    with pytest.raises(DatabaseError, match="built with the centre crop, the policy runs without it"):
        calibrate.main([*common, "--db", str(tmp_path / "db"), "--out", str(tmp_path / "c.json"),
                        "--cache-dir", str(tmp_path / "cache")])
    # The node's loader: decoder.center_crop crops what the model sees and must match the database.
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.policy import PolicyPaths, load_policy

    paths = PolicyPaths(model, db_path=str(tmp_path / "db"))
    with pytest.raises(DatabaseError, match="built with the centre crop, the policy runs without it"):
        load_policy(paths, DecoderConfig(method="retrieval", views=("agentview",)))
    decoder = load_policy(paths, DecoderConfig(method="retrieval", views=("agentview",), center_crop=True))
    try:
        assert decoder.vla.fingerprint() != load_policy(
            PolicyPaths(model), DecoderConfig(method="ar", views=("agentview",))).vla.fingerprint()
    finally:
        decoder.store.close()


def test_load_options_of_both_model_kinds(workspace, tmp_path) -> None:
    import shutil

    from heisd_ros.core.errors import ModelLoadError, UnknownTaskError
    from heisd_ros.models.loader import load_policy_model, load_vla, tiny_vla

    ckpt = tmp_path / "mixture"
    shutil.copytree(workspace["root"] / CHECKPOINT, ckpt)
    write_stats = json.loads((ckpt / "dataset_statistics.json").read_text())[UNNORM_KEY]
    (ckpt / "dataset_statistics.json").write_text(json.dumps({"bridge_orig": write_stats, UNNORM_KEY: write_stats}))
    with pytest.raises(UnknownTaskError, match="give unnorm_key"):
        load_vla(ckpt).stats()
    assert load_policy_model(ckpt, unnorm_key=UNNORM_KEY).vla.stats() is not None
    with pytest.raises(UnknownTaskError, match="'nope' not in statistics"):
        load_vla(ckpt, unnorm_key="nope")
    tiny_vla(hidden_size=32, layers=1).save_pretrained(tmp_path / "heisd")
    with pytest.raises(ModelLoadError, match="center_crop is OpenVLA's"):
        load_vla(tmp_path / "heisd", center_crop=True)
    assert load_vla(tmp_path / "heisd", unnorm_key="default").stats() is not None
    with pytest.raises(UnknownTaskError, match="'nope' not in statistics"):
        load_vla(tmp_path / "heisd", unnorm_key="nope")


def test_tools_that_rewrite_a_heisd_vla_refuse_the_checkpoint(workspace, tmp_path) -> None:
    from heisd_ros.core.errors import ModelLoadError
    from heisd_ros.models.loader import require_heisd_vla
    from heisd_ros.tools import train_prior

    root = workspace["root"]
    with pytest.raises(ModelLoadError, match="heisd train-prior .* is an OpenVLA checkpoint"):
        train_prior.main(["--model", str(root / CHECKPOINT), "--demos", str(root / "libero_spatial"),
                          "--out", str(tmp_path / "prior"), "--no-progress"])
    assert not (tmp_path / "prior").exists()
    for tool in ("heisd-libero train-vla --init-from", "heisd-libero publish-mini"):
        with pytest.raises(ModelLoadError, match=tool):
            require_heisd_vla(root / CHECKPOINT, tool)
