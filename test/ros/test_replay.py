"""heisd replay: a synthetic bag played into the policy node over real topics, outputs recorded."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import pytest
import rclpy
from fake_decoder import FakeDecoder
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.bags import BagError, read_messages, topic_types
from heisd_ros.replay import target
from heisd_ros.replay.bag_stream import StreamLog, plan_routes, stream_segments
from heisd_ros.ros.node import PolicyNode
from heisd_ros.tools import replay as rp
from heisd_ros.tools.make_bag import MakeBagConfig, make_bag

pytestmark = pytest.mark.slow  # end to end: bags replayed into started nodes

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 62
REPO = Path(__file__).resolve().parents[2]

scripted = functools.partial(FakeDecoder, modes=("drafter", "retrieval"), ms_per_forward=3.0, image_shape=(64, 64, 3))
"""The method from the config, the mode by step parity, 64x64 views checked, 3 ms per LLM forward."""


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("bags") / "in_mcap"
    make_bag(path, MakeBagConfig(steps=12, seed=3))
    return path


def read_bag(bag, slop_s=0.05):
    """Every routed message of `bag` (default topics of the node in the root namespace) and the step count."""
    cfg = target.load_node_config(None)
    plan = plan_routes(topic_types(bag), target.input_targets(cfg, "policy_node", "/"), cfg.decoder.views)
    log = StreamLog()
    messages = [m for seg in stream_segments(bag, plan, slop_s, log) for m in seg.messages]
    return messages, log.steps


def _cfg(tmp_path, **kw):
    base = dict(fast=True, start_node=True, out=str(tmp_path / "out"), domain_id=DOMAIN_ID, quiet=True,
                params=("control_rate_hz:=50.0", "diagnostics_period_s:=0.2"), settle_s=0.3)  # fmt: skip
    cfg = {**base, **kw}
    cfg["params"] = ("model_dir:=fake", *cfg["params"]) if cfg["start_node"] else cfg["params"]  # the node needs one
    return rp.ReplayConfig(**cfg)


def _read(out: Path) -> dict[str, list]:
    got: dict[str, list] = {}
    for r in read_messages(out):
        got.setdefault(r.topic, []).append((r.msgtype, r.msg))
    return got


def test_make_bag_contents(bag):
    messages, steps = read_bag(bag)
    assert steps == 12
    topics = {m.topic for m in messages}
    assert topics == {"/agentview/image_raw", "/wrist/image_raw", "/ee_pose", "/instruction", "/episode_result"}


def test_make_bag_is_deterministic_and_validates(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_bag(a, MakeBagConfig(steps=3, storage="sqlite3"))
    make_bag(b, MakeBagConfig(steps=3, storage="sqlite3"))
    ma, _ = read_bag(a)
    mb, _ = read_bag(b)
    assert [m.raw for m in ma] == [m.raw for m in mb]
    with pytest.raises(ConfigError):
        MakeBagConfig(storage="bag")
    with pytest.raises(ConfigError, match="exists"):
        make_bag(a, MakeBagConfig(steps=1))


def test_fast_replay_one_command_per_synchronised_step(bag, tmp_path):
    cfg = _cfg(tmp_path, params=("control_rate_hz:=50.0", "diagnostics_period_s:=0.2", "command_frame_id:=base_link"))
    result = rp.replay(bag, cfg, decoder_factory=scripted)
    row = result["methods"]["heisd"]
    assert row["bag_steps"] == 12 and row["decoded_steps"] == 12 and row["commands"] == 12 and row["timeouts"] == 0
    assert row["mode_mix"] == {"drafter": 6, "retrieval": 6} and row["forwards_per_step"] == 2.0
    assert row["mean_step_ms"] == row["p99_step_ms"] == 6.0 and row["episodes"] == 1
    assert row["accept_length"] == row["tokens_per_forward_verified"] == 3.5 and "speedup_vs_ar" not in row
    assert result["git_rev"] and result["config"]["fast"]
    got = _read(Path(cfg.out))
    cmds = [m for t, m in got["/arm_command"]]
    assert len(cmds) == 12 and got["/arm_command"][0][0] == "heisd_ros/msg/ArmCommand"
    assert all(c.header.frame_id == "base_link" for c in cmds)
    stamps = [c.header.stamp.sec + 1e-9 * c.header.stamp.nanosec for c in cmds]
    assert stamps == sorted(stamps) and len(set(stamps)) == 12
    assert [c.step_id for c in cmds] == list(range(1, 13))
    assert len(got["/decode_stats"]) == 12 and "/diagnostics" in got


def test_several_methods_on_sqlite_bag(tmp_path):
    src = tmp_path / "in_sqlite"
    make_bag(src, MakeBagConfig(episodes=2, steps=3, storage="sqlite3", seed=4))
    cfg = _cfg(tmp_path, methods=("ar", "heisd"))
    result = rp.replay(src, cfg, decoder_factory=scripted)
    assert set(result["methods"]) == {"ar", "heisd"}
    assert result["methods"]["ar"]["forwards_per_step"] == 7.0 and result["methods"]["ar"]["decoded_steps"] == 6
    heisd = result["methods"]["heisd"]
    assert heisd["decoded_steps"] == 6 and heisd["episodes"] == 2
    # the scripted decoder: ar 21 ms, heisd 6 ms on every step of both episodes
    assert heisd["speedup_vs_ar"] == pytest.approx(3.5) and heisd["speedup_vs_ar_ci95"] == pytest.approx([3.5, 3.5])
    assert result["bootstrap"]["episodes"] == 2 and result["bootstrap"]["paired"]
    got = _read(Path(cfg.out))
    assert len(got["/ar/arm_command"]) == 6 and len(got["/heisd/arm_command"]) == 6
    assert {m.method for _, m in got["/ar/decode_stats"]} == {"ar"}
    table = rp.format_summary(list(result["methods"].values()), result["bootstrap"])
    assert "ar" in table and "heisd 3.50x [3.50, 3.50]" in table


def test_episodes_and_speedup_of_a_one_episode_bag():
    """Episodes split where the node's step_id starts again; one episode gives no interval."""
    from types import SimpleNamespace

    from heisd_ros.replay.playback import MethodRun

    def run(method, ids, ms):
        return MethodRun(method, stats=[(0.0, SimpleNamespace(step_id=i, total_ms=t, mode="ar", llm_forwards=7,
                                                              skipped=False)) for i, t in zip(ids, ms)])

    two = run("ar", [1, 2, 3, 1, 2], [1.0, 2.0, 3.0, 4.0, 5.0])
    assert rp.episode_step_ms(two) == [[1.0, 2.0, 3.0], [4.0, 5.0]]
    runs = [run("ar", [1, 2], [20.0, 20.0]), run("heisd", [1, 2], [5.0, 15.0])]
    rows = {r.method: rp.summarise(r, 2) for r in runs}
    meta = rp.add_speedups(rows, runs)
    assert rows["heisd"]["speedup_vs_ar"] == 2.0 and rows["heisd"]["median_speedup_vs_ar"] == 2.0
    assert rows["heisd"]["speedup_vs_ar_ci95"] is None and "no bootstrap interval" in meta["note"]
    assert "heisd 2.00x no interval (1 episode)" in rp.format_summary(list(rows.values()), meta)
    assert rp.add_speedups({"heisd": {}}, runs[1:]) is None


def test_compressed_bag(tmp_path):
    pytest.importorskip("PIL")
    src = tmp_path / "in_png"
    make_bag(src, MakeBagConfig(steps=4, compressed="png", seed=5))
    cfg = _cfg(tmp_path, params=("control_rate_hz:=50.0", "compressed_images:=true"))
    assert rp.replay(src, cfg, decoder_factory=scripted)["methods"]["heisd"]["commands"] == 4


def test_paced_replay_into_a_running_node(bag, tmp_path):
    """No --start-node: the node runs on its own (here in another context of this process)."""
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=DOMAIN_ID)
    node = PolicyNode(scripted, context=ctx, parameter_overrides=[
        Parameter("model_dir", value="fake"), Parameter("control_rate_hz", value=40.0),
        Parameter("command_enabled", value=True)])  # fmt: skip
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    th = threading.Thread(target=ex.spin, daemon=True)
    th.start()
    try:
        cfg = _cfg(tmp_path, fast=False, rate=2.0, start_node=False, params=())
        t0 = time.monotonic()
        row = rp.replay(bag, cfg)["methods"]["node"]
        wall = time.monotonic() - t0
        # 12 steps at 10 Hz (+ instruction and result slots) played at 2x: about 0.7 s of messages
        assert row["commands"] >= 10 and row["decoded_steps"] <= 12
        assert wall < 10
    finally:
        ex.shutdown(timeout_sec=2.0)
        th.join(2.0)
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def test_no_running_node_is_a_clear_error(bag, tmp_path):
    cfg = _cfg(tmp_path, start_node=False, params=(), domain_id=DOMAIN_ID + 1, connect_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="is the policy node .* running"):
        rp.replay(bag, cfg)
    assert time.monotonic() - t0 < 20


def test_cli_rejects_bad_arguments(bag, tmp_path, capsys):
    assert rp.main([str(bag), "--method", "ar", "--method", "heisd", "--out", str(tmp_path / "x")]) == 2
    assert "several methods need --start-node" in capsys.readouterr().err
    assert rp.main([str(tmp_path / "missing"), "--start-node", "--params-file", "nope.yaml"]) == 2


# --- untrusted bags: random and damaged files give a clear error, never a crash -------------------

import shutil
import tempfile

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def small_bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    out = {}
    for storage in ("mcap", "sqlite3"):
        make_bag(root / storage, MakeBagConfig(steps=2, storage=storage, seed=6))
        out[storage] = root / storage
    return out


def _read_damaged(src: Path, damage) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bag = Path(tmp) / "bag"
        shutil.copytree(src, bag)
        damage(bag)
        try:
            messages, steps = read_bag(bag)
        except (ConfigError, BagError) as err:
            assert str(bag) in str(err)
            return
        assert steps <= 2 and all(m.topic.startswith("/") for m in messages)


def _data_file(bag: Path) -> Path:
    return next(p for p in bag.iterdir() if p.name != "metadata.yaml")


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(storage=st.sampled_from(["mcap", "sqlite3"]), frac=st.floats(0.0, 1.0))
def test_truncated_bag_is_a_clear_error(small_bags, storage, frac):
    def cut(bag):
        f = _data_file(bag)
        raw = f.read_bytes()
        f.write_bytes(raw[: int(frac * len(raw))])

    _read_damaged(small_bags[storage], cut)


@FUZZ
@example(storage="mcap", flips=[(0.027843440438522646, 73)])  # a chunk's record size read as 1.5e19: OverflowError
@example(storage="mcap", flips=[(0.988563553055126, 6)])  # an index record's size read as 2.6e10: MemoryError
@given(storage=st.sampled_from(["mcap", "sqlite3"]), flips=st.lists(st.tuples(st.floats(0.0, 0.9999), st.integers(0, 255)),
                                                                   min_size=1, max_size=30))  # fmt: skip
def test_corrupted_bag_bytes_are_a_clear_error(small_bags, storage, flips):
    def flip(bag):
        f = _data_file(bag)
        raw = bytearray(f.read_bytes())
        for pos, value in flips:
            raw[int(pos * len(raw))] = value
        f.write_bytes(bytes(raw))

    _read_damaged(small_bags[storage], flip)


@FUZZ
@given(storage=st.sampled_from(["mcap", "sqlite3"]), junk=st.binary(max_size=300), where=st.sampled_from(["data", "metadata"]))
def test_random_bag_files_are_a_clear_error(small_bags, storage, junk, where):
    def replace(bag):
        (_data_file(bag) if where == "data" else bag / "metadata.yaml").write_bytes(junk)

    _read_damaged(small_bags[storage], replace)


def test_fast_replay_stops_with_the_node_refusal_instead_of_waiting_out_every_step(bag, tmp_path):
    """The bag's pose is in base_link, the node commands in another frame: every step is refused.
    The replay stops after max_silent_steps steps with the node's reason, not 12 step timeouts."""
    from heisd_ros.replay.playback import ReplayStalled

    cfg = _cfg(tmp_path, step_timeout_s=1.0, max_silent_steps=3,
               params=("control_rate_hz:=50.0", "diagnostics_period_s:=0.2", "command_frame_id:=world"))  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(ReplayStalled, match=r"none of the last 3 steps.*refusals: [^;]*command_frame_id"):
        rp.replay(bag, cfg, decoder_factory=scripted)
    assert time.monotonic() - t0 < 8 * cfg.step_timeout_s + 10.0  # warm-up, start, 3 silent steps
