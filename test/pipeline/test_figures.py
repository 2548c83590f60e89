"""The report figures against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heisd_ros.pipeline.figures import (
    accept_figures,
    bootstrap_meta,
    bootstrap_ratio_of_means,
    interval_text,
    latency_figures,
    speedup_figures,
    wilson_interval,
)


@pytest.mark.parametrize("k, lo, hi", [
    # z = 1.96, n = 20, z^2 = 3.8416: centre = (p + z^2/40) / (1 + z^2/20),
    # half = z sqrt(p(1-p)/20 + z^2/1600) / (1 + z^2/20)
    (0, 0.0, 0.161130),        # centre = half = 0.09604 / 1.19208 = 0.080565
    (8, 0.218804, 0.613422),   # centre 0.49604 / 1.19208, half 1.96 * sqrt(0.014401) / 1.19208
    (20, 0.838870, 1.0),       # the mirror image of 0/20
])
def test_wilson_by_hand(k, lo, hi) -> None:
    got = wilson_interval(k, 20)
    assert got == pytest.approx((lo, hi), abs=1e-6)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_latency_percentiles_are_type_7() -> None:
    # 1..100: p95 at rank 1 + 99 * 0.95 = 95.05 -> 95.05; p99 at 1 + 99 * 0.99 = 99.01 -> 99.01
    got = latency_figures(list(range(1, 101)))
    assert list(got) == ["mean_step_ms", "median_step_ms", "p95_step_ms", "p99_step_ms"]  # mean first
    assert got == pytest.approx({"mean_step_ms": 50.5, "median_step_ms": 50.5, "p95_step_ms": 95.05,
                                 "p99_step_ms": 99.01})
    # 10, 20, 30, 40: p95 at rank 1 + 3 * 0.95 = 3.85 -> 30 + 0.85 * 10; p99 at 3.97 -> 39.7
    got = latency_figures([40, 10, 30, 20], name="decode")
    assert got == pytest.approx({"mean_decode_ms": 25.0, "median_decode_ms": 25.0, "p95_decode_ms": 38.5,
                                 "p99_decode_ms": 39.7})
    assert all(math.isnan(v) for v in latency_figures([]).values())


def test_accept_lengths_by_hand() -> None:
    # ar step (7 forwards), drafter step (2 forwards), two skips, retrieval step (1 forward):
    # paper's: 7 x 5 steps / (7 + 2 + 1 + 2 skip cycles) = 35 / 12; verified: 7 x 3 / 10 forwards
    got = accept_figures([7, 2, 0, 0, 1], [False, False, True, True, False])
    assert got["accept_length"] == pytest.approx(35 / 12)
    assert got["tokens_per_forward_verified"] == pytest.approx(2.1)
    only_skips = accept_figures([0, 0], [True, True])
    assert only_skips["accept_length"] == 7.0 and math.isnan(only_skips["tokens_per_forward_verified"])
    assert accept_figures([7] * 4, [False] * 4) == {"accept_length": 1.0, "tokens_per_forward_verified": 1.0}


def test_bootstrap_is_deterministic_and_sensible() -> None:
    rng = np.random.default_rng(5)
    ar = [list(rng.uniform(40, 60, size=n)) for n in (30, 12, 25, 40, 18)]
    heisd = [list(rng.uniform(5, 50, size=n)) for n in (28, 15, 20, 41, 22)]
    a = bootstrap_ratio_of_means(ar, heisd, paired=True)
    assert a == bootstrap_ratio_of_means(ar, heisd, paired=True)  # the fixed seed
    assert a != bootstrap_ratio_of_means(ar, heisd, paired=True, seed=1)
    point = speedup_figures(ar, heisd, paired=True)
    assert a[0] < point["speedup_vs_ar"] < a[1]
    assert point["speedup_vs_ar_ci95"] == a
    unpaired = bootstrap_ratio_of_means(ar, heisd[:3], paired=False)
    assert unpaired is not None and unpaired[0] < unpaired[1]


def test_bootstrap_by_hand() -> None:
    # Each episode of the method takes half the time of ar's same episode, with as many steps:
    # every paired resample has the ratio 2, so the interval is [2, 2].
    ar = [[10.0, 30.0], [50.0], [8.0, 8.0, 8.0]]
    half = [[x / 2 for x in e] for e in ar]
    assert bootstrap_ratio_of_means(ar, half, paired=True) == pytest.approx([2.0, 2.0])
    # one episode (or one left after dropping empty ones): no interval
    assert bootstrap_ratio_of_means([[1.0, 2.0]], [[1.0]], paired=True) is None
    assert bootstrap_ratio_of_means([[1.0], []], [[1.0], [2.0]], paired=True) is None
    with pytest.raises(ValueError):
        bootstrap_ratio_of_means([[1.0]] * 2, [[1.0]] * 3, paired=True)


def test_speedups_are_ratios_of_means_medians_and_p95() -> None:
    ar = [[50.0, 50.0, 50.0, 50.0]]
    heisd = [[10.0, 10.0, 10.0, 50.0]]  # mean 20, median 10, p95 50 - 0.15 * 40 = 44
    got = speedup_figures(ar, heisd, paired=True)
    assert got["speedup_vs_ar"] == 2.5 and got["median_speedup_vs_ar"] == 5.0
    assert got["p95_speedup_vs_ar"] == pytest.approx(50 / 44)
    assert got["speedup_vs_ar_ci95"] is None  # one episode
    assert interval_text(got["speedup_vs_ar_ci95"], n_episodes=1) == "no interval (1 episode)"
    assert interval_text([1.234, 2.5]) == "[1.23, 2.50]"
    assert math.isnan(speedup_figures([], heisd, paired=False)["speedup_vs_ar"])
    assert "note" in bootstrap_meta(1, True) and "note" not in bootstrap_meta(2, True)
