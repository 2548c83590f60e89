"""The figures every report gives per method (`heisd bench`, `heisd-libero eval-libero`, `heisd replay`),
computed one way for all of them (docs/design.md §9). Pure numpy: no torch, no ROS.

Definitions:
- Step latency: `mean_step_ms` first (a control loop's throughput is its mean step), then
  `median_step_ms`, `p95_step_ms`, `p99_step_ms` (its deadline is the tail). A percentile pN is
  numpy's default: linear interpolation between order statistics (Hyndman and Fan's type 7).
- `speedup_vs_ar` = mean `ar` step / mean step of the method: a ratio of means.
  `median_speedup_vs_ar` and `p95_speedup_vs_ar` are the same ratio of medians and of p95s.
- `speedup_vs_ar_ci95`: 95 % percentile bootstrap interval of `speedup_vs_ar` over episodes: the
  episodes are drawn with replacement (`BOOTSTRAP_RESAMPLES` draws from a generator seeded with
  `BOOTSTRAP_SEED`), paired (one draw of episode indices serves `ar` and the method) when both ran
  the same episodes, each resample's ratio of means is taken over the pooled steps of the drawn
  episodes. None with fewer than two episodes: one episode gives no interval.
- `episode_time_ratio` (`ratio_of_sums`): over the (task, init state) pairs both ran, the sum of
  `ar`'s episode decode times over the sum of the method's (time per task rather than per step),
  with the same seeded percentile bootstrap over the pairs.
- `accept_length` (the paper's): tokens fixed per decoding cycle, a cycle being one verification
  forward or one skipped step (a skip fixes all 7 tokens in one cycle):
  7 x steps / (LLM forwards + skipped steps).
- `tokens_per_forward_verified`: 7 x verified steps / LLM forwards on those steps, verified meaning
  not skipped: what each target-model forward fixed where the target model ran.
- `success_rate_ci95`: 95 % Wilson score interval of a success rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

TOKENS_PER_STEP = 7
"""Action tokens of one control step (the 7 action dimensions)."""
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
LEVEL = 0.95
Z_95 = 1.96
"""Normal quantile of a two-sided 95 % interval (Wilson)."""


def distribution(values: Sequence[float]) -> dict[str, float]:
    """`mean`, `median`, `p95`, `p99` of `values`, in that order (NaN when empty)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {k: math.nan for k in ("mean", "median", "p95", "p99")}
    return {"mean": float(v.mean()), "median": float(np.median(v)), "p95": float(np.percentile(v, 95)),
            "p99": float(np.percentile(v, 99))}


def latency_figures(ms: Sequence[float], name: str = "step") -> dict[str, float]:
    """`mean_<name>_ms`, `median_<name>_ms`, `p95_<name>_ms`, `p99_<name>_ms` of `ms` (NaN when empty)."""
    return {f"{k}_{name}_ms": v for k, v in distribution(ms).items()}


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate (sensible at 0 and n; NaN for n = 0)."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def accept_figures(forwards: Sequence[int], skipped: Sequence[bool]) -> dict[str, float]:
    """`accept_length` and `tokens_per_forward_verified` of steps given as (LLM forwards, skipped)."""
    f = np.asarray(forwards, dtype=np.int64)
    s = np.asarray(skipped, dtype=bool)
    cycles = int(f.sum() + s.sum())
    verified_forwards = int(f[~s].sum())
    return {
        "accept_length": TOKENS_PER_STEP * f.size / cycles if cycles else math.nan,
        "tokens_per_forward_verified": (TOKENS_PER_STEP * int((~s).sum()) / verified_forwards
                                        if verified_forwards else math.nan),
    }


def _sums(episodes: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([float(np.sum(e)) for e in episodes]), np.array([len(e) for e in episodes], dtype=np.float64))


def bootstrap_ratio_of_means(numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]], *,
                             paired: bool, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                             level: float = LEVEL) -> list[float] | None:
    """Percentile bootstrap interval of mean(numerator steps) / mean(denominator steps).

    Each argument is a list of episodes, each episode the step values of that episode. Paired: the
    two lists hold the same episodes in the same order and one draw of indices resamples both; else
    each list is resampled on its own. Empty episodes are dropped (a pair when either side is
    empty). None when either side has fewer than two episodes left.
    """
    if paired:
        if len(numerator) != len(denominator):
            raise ValueError("paired bootstrap needs the same episodes on both sides")
        keep = [i for i in range(len(numerator)) if len(numerator[i]) and len(denominator[i])]
        numerator, denominator = [numerator[i] for i in keep], [denominator[i] for i in keep]
    else:
        numerator, denominator = [e for e in numerator if len(e)], [e for e in denominator if len(e)]
    if len(numerator) < 2 or len(denominator) < 2:
        return None
    rng = np.random.default_rng(seed)
    sn, cn = _sums(numerator)
    sd, cd = _sums(denominator)
    i = rng.integers(0, len(numerator), size=(resamples, len(numerator)))
    j = i if paired else rng.integers(0, len(denominator), size=(resamples, len(denominator)))
    ratios = (sn[i].sum(1) / cn[i].sum(1)) / (sd[j].sum(1) / cd[j].sum(1))
    tail = 100.0 * (1.0 - level) / 2
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def speedup_figures(ar_episodes: Sequence[Sequence[float]], episodes: Sequence[Sequence[float]], *,
                    paired: bool) -> dict[str, float | list[float] | None]:
    """A method's speedups over `ar` from both methods' step latencies (ms), episode by episode."""
    ar = np.asarray([x for e in ar_episodes for x in e], dtype=np.float64)
    me = np.asarray([x for e in episodes for x in e], dtype=np.float64)
    if not ar.size or not me.size:
        return {"speedup_vs_ar": math.nan, "speedup_vs_ar_ci95": None, "median_speedup_vs_ar": math.nan,
                "p95_speedup_vs_ar": math.nan}
    return {
        "speedup_vs_ar": float(ar.mean() / me.mean()),
        "speedup_vs_ar_ci95": bootstrap_ratio_of_means(ar_episodes, episodes, paired=paired),
        "median_speedup_vs_ar": float(np.median(ar) / np.median(me)),
        "p95_speedup_vs_ar": float(np.percentile(ar, 95) / np.percentile(me, 95)),
    }


def ratio_of_sums(numerator: Sequence[float], denominator: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> tuple[float, list[float] | None]:
    """(sum(numerator) / sum(denominator), its percentile bootstrap interval) over paired units.

    The two lists hold one value per unit, in the same order (e.g. ar's and a method's decode time
    of the same (task, init state) episode); one draw of unit indices resamples both sides, from a
    generator seeded with `seed`. A ratio of sums, not a mean of per-unit ratios, so that a long
    episode weighs as much as its time. NaN without units; no interval with fewer than two.
    """
    if len(numerator) != len(denominator):
        raise ValueError("a ratio of paired sums needs one value per unit on both sides")
    total = float(np.sum(denominator)) if len(denominator) else 0.0
    ratio = float(np.sum(numerator)) / total if total > 0 else math.nan
    # one "step" per unit: the bootstrap's ratio of means is then the ratio of sums of the drawn units
    ci = bootstrap_ratio_of_means([[x] for x in numerator], [[x] for x in denominator], paired=True,
                                  resamples=resamples, seed=seed, level=level)
    return ratio, ci


def bootstrap_meta(n_episodes: int, paired: bool, unit: str = "episode") -> dict[str, object]:
    """How the speedup intervals of a report were drawn, for its `_meta`."""
    meta: dict[str, object] = {"statistic": "ratio of mean step latencies (ar / method)", "unit": unit,
                               "episodes": n_episodes, "paired": paired, "resamples": BOOTSTRAP_RESAMPLES,
                               "seed": BOOTSTRAP_SEED, "interval": "95 % percentile"}
    if n_episodes < 2:
        meta["note"] = f"{n_episodes} {unit}(s): no bootstrap interval"
    return meta


def interval_text(ci: Sequence[float] | None, fmt: str = ".2f", n_episodes: int | None = None) -> str:
    """'[lo, hi]', or why there is none."""
    if ci is None or any(x is None or not math.isfinite(x) for x in ci):
        return "no interval" + (f" ({n_episodes} episode{'s' if n_episodes != 1 else ''})"
                                if n_episodes is not None else "")
    return f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p of a paired 2x2 table's discordant counts `b` and `c`: the
    binomial test of min(b, c) among b + c at 1/2 (1.0 without discordant pairs)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def paired_difference_interval(both: int, first_only: int, second_only: int, neither: int,
                               z: float = Z_95) -> tuple[float, float]:
    """95 % interval of p_first - p_second from a paired 2x2 table: Newcombe's hybrid score interval
    (his method 10: the two Wilson intervals, joined through the table's phi correlation)."""
    n = both + first_only + second_only + neither
    if n == 0:
        return (math.nan, math.nan)
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    l1, u1 = wilson_interval(both + first_only, n, z)
    l2, u2 = wilson_interval(both + second_only, n, z)
    margins = (both + first_only) * (second_only + neither) * (both + second_only) * (first_only + neither)
    phi = (both * neither - first_only * second_only) / math.sqrt(margins) if margins else 0.0
    d = p1 - p2
    lower = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = d + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return (max(-1.0, lower), min(1.0, upper))


def mode_floor_ms(latency_ms: Mapping[str, float], forward_ms: Sequence[float]) -> float:
    """The floor of a step's mode: vision (+ projector) + retrieval (if issued) + at most
    one LLM forward (prefill fused with verification); a skipped step has no forward."""
    first = forward_ms[0] if forward_ms else 0.0
    return latency_ms.get("vision", 0.0) + latency_ms.get("projector", 0.0) + latency_ms.get("retrieval", 0.0) + first
