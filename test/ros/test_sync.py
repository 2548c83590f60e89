"""ApproxTimeSync: approximate-time synchronisation of views (a few frames held per view) plus the newest pose."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from heisd_ros.core.errors import ConfigError
from heisd_ros.ros.sync import FRAMES_KEPT, IDLE, ApproxTimeSync, SyncConfig

VIEWS = ("agentview", "wrist")


def make(slop=0.05, img=0.5, pose=0.5, views=VIEWS) -> ApproxTimeSync:
    return ApproxTimeSync(SyncConfig(views, slop, img, pose))


def feed(sync, t, views=VIEWS, pose=True):
    for v in views:
        sync.add_frame(v, t, f"{v}@{t}")
    if pose:
        sync.add_pose(t, f"pose@{t}")


def test_synchronised_set_is_returned_once():
    s = make()
    feed(s, 10.0)
    got = s.poll(now_s=10.01)
    assert got is not None
    assert [f.data for f in got.frames.values()] == ["agentview@10.0", "wrist@10.0"]
    assert got.pose.data == "pose@10.0" and got.stamp_s == 10.0
    s.consume(got)
    assert s.poll(now_s=10.02) is None and s.reason == IDLE and not s.problem


def test_the_set_is_the_newest_pair():
    s = make()
    for k in range(10):
        feed(s, 1.0 + 0.01 * k)
    got = s.poll(now_s=1.1)
    assert got.frames["agentview"].stamp_s == pytest.approx(1.09)
    assert got.frames["wrist"].stamp_s == pytest.approx(1.09)


def test_a_view_one_frame_ahead_pairs_the_previous_frames_instead_of_refusing():
    """A busy executor has taken agentview's next frame but not yet wrist's: the set is the
    previous pair, then the next pair once wrist's frame is in; nothing is refused."""
    s = make(slop=0.02)
    feed(s, 1.0)
    s.add_frame("agentview", 1.05, "agentview@1.05")
    s.add_pose(1.05, "pose@1.05")
    got = s.poll(1.06)
    assert [f.data for f in got.frames.values()] == ["agentview@1.0", "wrist@1.0"]
    s.consume(got)
    assert s.poll(1.07) is None and not s.problem  # waiting for wrist's next frame
    s.add_frame("wrist", 1.05, "wrist@1.05")
    got = s.poll(1.08)
    assert [f.data for f in got.frames.values()] == ["agentview@1.05", "wrist@1.05"]
    assert not s.refusals


def test_refusals_are_counted_by_kind():
    s = make(slop=0.05, img=0.5, pose=0.5)
    s.add_frame("agentview", 1.0, "a")
    assert s.poll(1.0) is None  # wrist missing
    s.add_frame("wrist", 1.2, "w")
    assert s.poll(1.2) is None  # out of sync (1.0 has no wrist partner within 0.05)
    assert s.poll(1.2) is None
    assert s.poll(2.0) is None  # stale
    assert dict(s.refusals) == {"missing_view": 1, "out_of_sync": 2, "stale_image": 1}


def test_out_of_order_frame_is_dropped():
    s = make()
    feed(s, 2.0)
    assert not s.add_frame("wrist", 1.9, "late")
    assert s.dropped_out_of_order == 1
    assert s.poll(2.0).frames["wrist"].data == "wrist@2.0"


def test_slop_within_and_beyond():
    s = make(slop=0.05)
    s.add_frame("agentview", 1.00, "a")
    s.add_frame("wrist", 1.04, "w")
    s.add_pose(1.0, "p")
    assert s.poll(1.05) is not None
    s = make(slop=0.05)
    s.add_frame("agentview", 1.00, "a")
    s.add_frame("wrist", 1.07, "w")
    s.add_pose(1.0, "p")
    assert s.poll(1.08) is None and s.problem and "out of sync" in s.reason


def test_missing_view():
    s = make()
    feed(s, 1.0, views=("agentview",))
    assert s.poll(1.0) is None and s.problem and "missing view" in s.reason and "wrist" in s.reason


def test_waiting_for_the_second_view_is_not_a_problem():
    s = make()
    feed(s, 1.0)
    s.consume(s.poll(1.0))
    s.add_frame("agentview", 1.1, "a")
    assert s.poll(1.1) is None and not s.problem and "waiting" in s.reason
    s.add_frame("wrist", 1.1, "w")
    assert s.poll(1.1) is not None


def test_stale_image_and_stale_pose():
    s = make(img=0.2, pose=0.3)
    feed(s, 1.0)
    assert s.poll(1.25) is None and "stale image" in s.reason and s.problem
    s = make(img=0.2, pose=0.3)
    feed(s, 1.0, pose=False)
    s.add_pose(0.6, "old")
    assert s.poll(1.0) is None and "stale pose" in s.reason and s.problem
    s.add_pose(0.95, "new")
    assert s.poll(1.0).pose.data == "new"


def test_stopped_camera_after_consumption_is_reported_stale():
    s = make(img=0.2)
    feed(s, 1.0)
    s.consume(s.poll(1.0))
    assert s.poll(1.1).__class__ is type(None) and s.reason == IDLE
    assert s.poll(1.5) is None and "stale image" in s.reason and s.problem


def test_future_stamps_rejected():
    s = make(img=0.2)
    feed(s, 5.0)
    assert s.poll(4.0) is None and "future" in s.reason


def test_no_pose_yet():
    s = make()
    feed(s, 1.0, pose=False)
    assert s.poll(1.0) is None and "pose" in s.reason


def test_stamp_is_newest_of_frames_and_pose():
    s = make()
    feed(s, 1.0, pose=False)
    s.add_pose(1.02, "p")
    got = s.poll(1.03)
    assert got.stamp_s == pytest.approx(1.02) and got.image_stamp_s == pytest.approx(1.0)


def test_reconfigure_keeps_views():
    s = make()
    s.reconfigure(SyncConfig(VIEWS, 0.1, 1.0, 1.0))
    with pytest.raises(ConfigError):
        s.reconfigure(SyncConfig(("x",), 0.1, 1.0, 1.0))


def test_config_validation():
    with pytest.raises(ConfigError):
        SyncConfig((), 0.1, 1.0, 1.0)
    with pytest.raises(ConfigError):
        SyncConfig(("a", "a"), 0.1, 1.0, 1.0)
    with pytest.raises(ConfigError):
        SyncConfig(("a",), -0.1, 1.0, 1.0)
    with pytest.raises(ConfigError):
        SyncConfig(("a",), float("nan"), 1.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from(VIEWS + ("pose",)), st.floats(0.0, 10.0, allow_nan=False)), max_size=60
    ),
    now=st.floats(0.0, 11.0, allow_nan=False),
)
def test_any_sequence_yields_a_valid_set_or_a_reason(events, now):
    s = make(slop=0.05, img=0.5, pose=0.5)
    for name, t in events:
        if name == "pose":
            s.add_pose(t, t)
        else:
            s.add_frame(name, t, t)
    got = s.poll(now)
    if got is None:
        assert s.reason
        return
    stamps = [f.stamp_s for f in got.frames.values()]
    assert max(stamps) - min(stamps) <= 0.05
    assert all(abs(now - t) <= 0.5 for t in stamps)
    assert abs(now - got.pose.stamp_s) <= 0.5
    # the frames held per view: the newest FRAMES_KEPT received, an older one dropped unless it came
    # from a restarted clock (more than image_staleness_s back), which replaces them; the set is
    # anchored on the lagging view's newest frame, the others' newest within slop after it
    held: dict[str, list[float]] = {v: [] for v in VIEWS}
    for n, t in events:
        if n in held:
            h = held[n]
            if h and t < h[-1]:
                if h[-1] - t <= 0.5:
                    continue
                h.clear()
            h.append(t)
            del h[:-FRAMES_KEPT]
    anchor = min(held[v][-1] for v in VIEWS)
    for v in VIEWS:
        fitting = [t for t in held[v] if t <= anchor + 0.05]
        assert got.frames[v].stamp_s == (fitting[-1] if fitting else held[v][-1])
    s.consume(got)
    assert s.poll(now) is None


# --- clock jumps --------------------------------------------------------------------------------


def test_bag_loop_under_sim_time_restarts_and_recovers():
    """A bag played in a loop with use_sim_time: stamps and the clock go back together."""
    s = make()
    for k in range(5):
        feed(s, 100.0 + 0.1 * k)
        s.consume(s.poll(100.0 + 0.1 * k + 0.01))
    got = s.poll(0.51)  # the clock jumped back to the bag's start: what is held is "in the future"
    assert got is None and s.problem and s.clock_resets == 1 and "clock jumped back 99.9" in s.events[-1]
    feed(s, 0.5)  # the new timeline, whose stamps are older than everything consumed before
    got = s.poll(0.51)
    assert got is not None and got.stamp_s == 0.5
    s.consume(got)
    feed(s, 0.6)
    assert s.poll(0.61).stamp_s == 0.6


def test_stamps_jumping_back_under_a_steady_clock_are_never_acted_on():
    """Wall clock, bag looped with --keep-stamps: the new stamps are old, hence stale: no set, a reason."""
    s = make()
    feed(s, 1000.0)
    s.consume(s.poll(1000.01))
    feed(s, 900.0)  # restarted source: replaces the held frames and pose
    assert s.clock_resets == 3 and len(s.events) == 3
    got = s.poll(1000.2)
    assert got is None and s.problem and "stale image" in s.reason
    feed(s, 1000.3)  # the live stream again
    assert s.poll(1000.31).stamp_s == 1000.3


def test_small_reordering_is_not_a_clock_jump():
    s = make(img=0.5, pose=0.5)
    feed(s, 10.0)
    assert not s.add_frame("wrist", 9.6, "late") and not s.add_pose(9.6, "late")
    assert s.clock_resets == 0 and s.dropped_out_of_order == 2


@settings(max_examples=200, deadline=None)
@given(
    segments=st.lists(st.tuples(st.floats(0.0, 1e4, allow_nan=False), st.integers(1, 8)), min_size=1, max_size=6),
    stale_now=st.booleans(),
)
@example(segments=[(0.25, 1), (0.0, 1), (0.25, 1)], stale_now=False)  # a re-sent, consumed stamp (CI, 2026-12-01)
@example(segments=[(0.25, 1), (0.0, 1), (0.1, 3)], stale_now=False)  # late frames, then newer ones
def test_any_clock_history_never_yields_stale_or_future_data_and_recovers(segments, stale_now):
    """Runs of 10 Hz frames starting at arbitrary times (jumps either way), the clock following them:
    every set is fresh relative to now, and the last run is always acted on."""
    s = make(slop=0.05, img=0.3, pose=0.3)
    got = None
    consumed_before_last_run = -math.inf
    for i, (start, n) in enumerate(segments):
        for k in range(n):
            t = start + 0.1 * k
            feed(s, t)
            now = t + (5.0 if stale_now else 0.01)
            got = s.poll(now)
            if got is not None:
                assert all(-0.3 <= now - f.stamp_s <= 0.3 for f in got.frames.values())
                assert -0.3 <= now - got.pose.stamp_s <= 0.3
                s.consume(got)
                if i < len(segments) - 1:
                    consumed_before_last_run = got.stamp_s
    if stale_now:
        assert got is None
        return
    start, n = segments[-1]
    last = start + 0.1 * (n - 1)
    prev_last = segments[-2][0] + 0.1 * (segments[-2][1] - 1) if len(segments) > 1 else -1e9
    # New frames (later than the run before and than the last set acted on: a re-sent stamp that was
    # already consumed, e.g. 0.25, 0.0 (late, dropped), 0.25, is a duplicate), or a real restart.
    newer = start > prev_last + 1e-9 and last > consumed_before_last_run + 1e-9
    if newer or start < prev_last - 0.3 - 1e-9:
        assert got is not None and got.stamp_s == pytest.approx(last)


def test_ros_free_modules_import_without_rclpy():
    import subprocess
    import sys

    modules = ("sync", "params", "param_file", "status", "watchdog", "standalone_args", "log_bridge", "conversions")
    code = (f"import sys; import {', '.join(f'heisd_ros.ros.{m}' for m in modules)}; "
            "assert 'rclpy' not in sys.modules, 'rclpy imported'; "
            "heisd_ros.ros.params.build_config({'model_dir': 'tiny'})")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_before_anything_arrives_the_node_is_waiting_not_rejecting():
    s = make()
    assert s.poll(1.0) is None and not s.problem and not s.heard and "received yet" in s.reason
    s.add_pose(1.0, "p")  # one source up, the cameras not: now a missing view is a fault
    assert s.poll(1.0) is None and s.problem and "missing view" in s.reason
    s.clear()
    assert s.poll(2.0) is None and not s.problem
