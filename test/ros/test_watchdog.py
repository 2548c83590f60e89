"""Watchdog: trips on an overrun (finished or still running), withholds until N steps are back within budget."""

from __future__ import annotations

from heisd_ros.ros.watchdog import Watchdog


def test_overrun_trips_and_recovery_needs_consecutive_good_steps():
    w = Watchdog()
    assert w.step(0.05, 0.3, 3) == (True, "")
    ok, why = w.step(0.31, 0.3, 3)
    assert not ok and "310 ms > budget 300 ms" in why and w.tripped and w.state.trips == 1
    assert [w.step(0.01, 0.3, 3)[0] for _ in range(2)] == [False, False]
    assert not w.step(0.4, 0.3, 3)[0]  # a relapse starts the count again (same trip)
    assert [w.step(0.01, 0.3, 3)[0] for _ in range(3)] == [False, False, True]
    assert not w.tripped and w.state.trips == 1
    assert w.step(0.01, 0.3, 3) == (True, "")


def test_a_hanging_inference_is_reported_at_once_then_every_repeat_period():
    w = Watchdog()
    assert not w.running(0.2, 0.3, 1.0)
    assert w.running(0.35, 0.3, 1.0) and w.tripped
    assert not w.running(0.5, 0.3, 1.0) and not w.running(1.3, 0.3, 1.0)  # within the repeat period
    assert w.running(1.36, 0.3, 1.0)  # the hang lasts: reported again
    assert [w.running(t, 0.3, 1.0) for t in (2.0, 2.4, 3.0, 3.5)] == [False, True, False, True]
    assert w.state.trips == 1  # one hang, one trip
    w.finished()
    assert w.running(0.9, 0.3, 1.0) and w.state.trips == 1  # a new hang is reported at once
    assert not w.step(0.9, 0.3, 1)[0]
    assert w.step(0.1, 0.3, 1) == (True, "") and not w.tripped


def test_a_zero_repeat_period_reports_every_check():
    w = Watchdog()
    assert [w.running(t, 0.3, 0.0) for t in (0.31, 0.31, 0.4)] == [True, True, True]
