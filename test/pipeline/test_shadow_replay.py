"""replay_episode: heisd's decisions at a candidate point over shadow records, the sequence included."""

from __future__ import annotations

import math

import pytest

from heisd_ros.core.config import DecoderConfig, FusedMetricConfig, SourceChoiceConfig, VerifySkipConfig
from heisd_ros.core.shadow import ShadowHit, ShadowStep
from heisd_ros.pipeline.shadow_replay import replay_episode

AR = (100, 100, 100, 128, 128, 128, 255)


def _hit(shift: int = 0, similarity: tuple[float, ...] = (0.99, 0.99, 0.99, 0.99), distance_m: float = 0.005,
         gripper: int = 255, switch_in: int = 0) -> ShadowHit:
    return ShadowHit(score=0.9, tokens=(100 + shift, 100, 100, 128, 128, 128, gripper), distance_m=distance_m,
                     similarity=similarity, gripper_switch_in=switch_in)


def _steps(n: int, hits=lambda t: (_hit(),), f: float = 0.5) -> list[ShadowStep]:
    """n recorded steps; the first has no earlier live feature (its hits' similarity is empty)."""
    out = []
    for t in range(n):
        hs = tuple(ShadowHit(h.score, h.tokens, h.distance_m, h.similarity[:t], h.gripper_switch_in) for h in hits(t))
        out.append(ShadowStep(fused_metric=f if t >= 2 else math.nan, executed_tokens=AR, hits=hs, drafter_forwards=3,
                              tree_forwards=1, tree_tokens=hs[0].tokens if hs else ()))  # fmt: skip
    return out


def _point(**skip) -> DecoderConfig:
    vs = VerifySkipConfig(**{"min_similarity": 0.98, "max_distance_m": 0.01, "max_consecutive_skips": 3, **skip})
    return DecoderConfig(method="heisd", fused_metric=FusedMetricConfig(tau=0.0),
                         source_choice=SourceChoiceConfig(enabled=False), verify_skip=vs)  # fmt: skip


def test_skips_run_at_most_n_max_in_a_row_and_each_reads_the_live_feature_of_its_last_verified_step():
    steps = replay_episode(_steps(10), _point())
    # no window for two steps (drafter, verified: they give the live feature), then N_max skips and a verified one
    assert [s.mode for s in steps] == ["drafter", "drafter", "skip", "skip", "skip", "retrieval",
                                       "skip", "skip", "skip", "retrieval"]  # fmt: skip
    assert steps[5].skip_check == "max_consecutive_skips"
    assert [s.cost_forwards for s in steps[4:6]] == [0.3, 1 + 0.5 + 0.9]  # SourceChoiceConfig's counted costs


def test_a_similarity_below_min_s_at_the_lag_of_the_skips_since_the_last_verified_step_stops_the_run():
    # the hit is similar to the newest live feature only: after one skip the check reads lag 1
    steps = replay_episode(_steps(6, hits=lambda t: (_hit(similarity=(0.99, 0.5, 0.5, 0.5)),)), _point())
    assert [s.mode for s in steps] == ["drafter", "drafter", "skip", "retrieval", "skip", "retrieval"]
    assert steps[3].skip_check == "low_similarity"


def test_deviations_are_against_what_was_executed_and_a_gripper_switch_ahead_refuses_the_skip():
    steps = replay_episode(_steps(5, hits=lambda t: (_hit(shift=12),)), _point())
    assert [s.position_bins for s in steps if s.mode == "skip"] == [12.0, 12.0, 12.0]
    assert not any(s.gripper_differs for s in steps)
    ahead = replay_episode(_steps(5, hits=lambda t: (_hit(switch_in=2),)), _point(gripper_lookahead_steps=3))
    assert "skip" not in [s.mode for s in ahead] and ahead[2].skip_check == "gripper_change_ahead"


def test_the_boundary_sends_steps_below_tau_to_the_drafter():
    cfg = _point()
    steps = replay_episode(_steps(5, f=0.2), DecoderConfig(method="heisd", fused_metric=FusedMetricConfig(tau=0.3),
                                                           source_choice=cfg.source_choice, verify_skip=cfg.verify_skip))
    assert {s.mode for s in steps} == {"drafter"}
    assert steps[0].cost_forwards == pytest.approx(3 + 0.5 + 0.7) and steps[0].position_bins == 0.0


# --- choosing the point from a recording --------------------------------------------------------------


def _recording(n_episodes: int, steps: int):
    """Episodes whose hits at similarity 0.992 are 4 bins from what ar executed and those below
    (0.985) 60 bins: skips beyond the bound start below min_S 0.99. Costs: ar 40 ms a step; a skip
    6 ms; the tree 10 ms more; the drafter 20 ms more."""
    from heisd_ros.pipeline.shadow_point import RecordedEpisode

    def hits(t):
        close = _hit(shift=4, similarity=(0.992,) * 4)
        far = _hit(shift=60, similarity=(0.985,) * 4)
        return (close,) if t % 2 else (far,)

    def priced(s: ShadowStep) -> ShadowStep:
        return ShadowStep(**{**s.__dict__, "vision_ms": 5.0, "retrieval_ms": 1.0, "drafter_ms": 20.0, "tree_ms": 10.0})

    return [RecordedEpisode("pick", [priced(s) for s in _steps(steps, hits=hits)], [40.0] * steps)
            for _ in range(n_episodes)]


def test_the_rule_chooses_the_fastest_point_whose_skip_steps_stay_in_bound():
    from heisd_ros.pipeline.shadow_point import ShadowRule, choose

    label, point, figures = choose(_point(), _recording(10, 60), ShadowRule(min_episodes=10, min_steps=500))
    assert point.verify_skip.min_similarity == 0.99 and figures[label]["skip_position_p95_bins"] <= 30
    assert point.verify_skip.max_consecutive_skips == 1  # skips never run on here: the tie goes to the stricter N_max
    # below 0.985 the 60-bin hits get through, unless the distance-to-verified check stops them
    loose = [f for lab, f in figures.items() if lab == "base" or
             (lab.startswith(("min_S=0.95", "min_S=0.98")) and lab.endswith("from_verified=0"))]
    assert loose and not any(f["eligible"] for f in loose)
    assert figures["min_S=0.95 N_max=3 from_verified=20"]["eligible"]
    assert all("position p95" in f["why_refused"][0] for f in loose)
    assert figures[label]["expected_speedup"] > figures["no_skip"]["expected_speedup"] > 1.0


def test_the_boundary_off_figure_is_the_chosen_point_with_tau_0():
    import dataclasses

    from heisd_ros.pipeline.shadow_point import ShadowRule, boundary_off, evaluate

    point = _point(min_similarity=0.99)
    point = dataclasses.replace(point, fused_metric=FusedMetricConfig(tau=0.3))
    off = boundary_off(point)
    assert off.fused_metric.tau == 0.0 and off.verify_skip == point.verify_skip
    # every window at F 0.2 is under tau 0.3: the drafter's at drafter cost; tau 0 retrieves and skips there
    def slow(s):  # the first two steps keep their missing window
        return s if math.isnan(s.fused_metric) else dataclasses.replace(s, fused_metric=0.2)

    episodes = [dataclasses.replace(e, steps=[slow(s) for s in e.steps]) for e in _recording(10, 60)]
    rule = ShadowRule(min_episodes=10, min_steps=500)
    on, without = evaluate(point, episodes, rule), evaluate(off, episodes, rule)
    assert set(on["mode_mix"]) == {"drafter"} and on["skip_share"] == 0.0
    assert without["mode_mix"].get("skip", 0) > 0 and without["expected_speedup"] > on["expected_speedup"]


def test_a_recording_too_short_for_the_rule_is_refused_with_the_reason():
    from heisd_ros.core.config import ConfigError
    from heisd_ros.pipeline.shadow_point import ShadowRule, choose

    with pytest.raises(ConfigError, match="3 episodes and 90 steps; the rule needs at least 10 episodes"):
        choose(_point(), _recording(3, 30), ShadowRule())


def test_runs_of_one_recorded_episode_count_once_and_n_max_beyond_the_records_is_refused():
    import dataclasses

    from heisd_ros.core.config import ConfigError
    from heisd_ros.core.shadow import LIVE_LAGS
    from heisd_ros.pipeline.shadow_point import ShadowRule, choose, evaluate

    # 12 runs of consecutive steps from 3 recorded episodes: 3 episodes for the rule, not 12
    runs = [dataclasses.replace(e, source=f"bag#{i % 3}") for i, e in enumerate(_recording(12, 60))]
    with pytest.raises(ConfigError, match="3 episodes and 720 steps"):
        choose(_point(), runs, ShadowRule())
    # a point that skips longer than the records hold live features for cannot be replayed exactly
    beyond = evaluate(_point(max_consecutive_skips=LIVE_LAGS + 1), runs, ShadowRule())
    assert not beyond["eligible"] and "beyond what the records replay" in beyond["why_refused"][0]

