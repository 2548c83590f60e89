"""HybridDecoder: forward accounting, verify-skip bound, bad input and database faults."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest

from heisd_ros.core.config import ConfigError, DecoderConfig, FusedMetricConfig, SourceChoiceConfig, VerifySkipConfig
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.errors import DatabaseUnavailableError, EmptyDatabaseError, InvalidObservationError, UnknownTaskError
from heisd_ros.core.types import Observation

ALWAYS_RETRIEVE = FusedMetricConfig(tau=-1.0)


def _heisd(vla, drafter, store, **kw) -> HybridDecoder:
    cfg = DecoderConfig(method="heisd", fused_metric=ALWAYS_RETRIEVE, **kw)
    return HybridDecoder(vla, cfg, store=store, drafter=drafter)


def test_ar_is_seven_forwards(ar, helpers):
    _, st = ar.step(helpers.random_obs(1))
    assert st.llm_forwards == 7 and st.tokens_per_forward == [1] * 7 and st.mode == "ar"
    assert st.accept_length == 1.0


def test_unsure_drafter_stops_deepening_at_min_path_prob(vla, drafter, ar, helpers):
    """A randomly initialised drafter is never 99.9 % sure: every draft stays one token deep, so no
    verification forward can accept more than that token plus the bonus, and tokens stay AR's."""
    from heisd_ros.core.config import DrafterTreeConfig

    obs = helpers.random_obs(5)
    deep = HybridDecoder(vla, DecoderConfig(method="drafter"), drafter=drafter)
    shallow = HybridDecoder(vla, DecoderConfig(method="drafter", drafter_tree=DrafterTreeConfig(min_path_prob=0.999)),
                            drafter=drafter)
    _, st_shallow = shallow.step(obs)
    assert st_shallow.tokens == helpers.ar_tokens(ar, obs) == deep.step(obs)[1].tokens
    assert max(st_shallow.tokens_per_forward) <= 2


@pytest.mark.parametrize("method", ["drafter", "specvla"])
def test_a_lossless_rule_never_drafts_the_last_missing_token(vla, drafter, ar, helpers, monkeypatch, method):
    """Under the strict rule the verify forward's own (bonus) token is the only one a draft of the
    last missing index could be accepted as, so drafts stop one index short; a relaxed rule (SpecVLA's)
    may accept a near token there, so its drafts reach the last index."""
    from heisd_ros.core.config import DrafterTreeConfig
    from heisd_ros.core.drafter import DrafterSession

    reached: list[int] = []  # the last action index each draft covers
    expand = DrafterSession.expand

    def recording_expand(self, root_hidden, depth, cfg, action_index=0):
        reached.append(action_index + depth - 1)
        return expand(self, root_hidden, depth, cfg, action_index)

    monkeypatch.setattr(DrafterSession, "expand", recording_expand)
    dec = HybridDecoder(vla, DecoderConfig(method=method, drafter_tree=DrafterTreeConfig(min_path_prob=0.0)),
                        drafter=drafter)
    for seed in range(3):
        obs = helpers.random_obs(seed)
        _, st = dec.step(obs)
        if method == "drafter":
            assert st.tokens == helpers.ar_tokens(ar, obs)
    assert reached
    assert max(reached) == (5 if method == "drafter" else 6), reached


def test_fully_accepted_retrieval_step_is_one_forward(vla, demo_store, helpers):
    dec = HybridDecoder(vla, DecoderConfig(method="retrieval"), store=demo_store)
    _, st = dec.step(helpers.random_obs(3))  # the database holds this observation's exact AR tokens
    assert st.mode == "retrieval" and st.llm_forwards == 1 and st.tokens_per_forward == [7]
    assert st.retrieval_score > 0.99


def test_skipped_steps_cost_zero_forwards_and_respect_the_bound(vla, drafter, demo_store, helpers):
    skip = VerifySkipConfig(min_similarity=-1.0, min_similarity_bounds=(-1.0, 1.0), max_distance_m=0.2,
                            max_consecutive_skips=2)
    dec = _heisd(vla, drafter, demo_store, verify_skip=skip)
    obs = helpers.random_obs(3)
    dec.reset(obs.instruction)
    stats = []
    for i in range(9):
        obs.ee_pos = np.array([0.0, 0.0, 0.001 * i]) + helpers.random_obs(3).ee_pos
        stats.append(dec.step(obs)[1])
    modes = [s.mode for s in stats]
    skips = [s for s in stats if s.skipped]
    assert skips and all(s.llm_forwards == 0 and s.accept_length == 7 for s in skips)
    run = 0
    for m in modes:  # never more than max_consecutive_skips in a row
        run = run + 1 if m == "skip" else 0
        assert run <= 2
    assert modes[0] != "skip"  # no live feature before the first verified step
    # Every retrieval step says why it was (not) skipped (a drafter-mode step ran no check): a
    # verified step after two skips hit the bound, a skip reports its similarity.
    assert all((s.skip_check == "") == (s.mode == "drafter") for s in stats)
    assert all(math.isnan(s.skip_similarity) for s in stats if s.mode == "drafter")
    assert all(s.skip_check == "skip" and -1.0 <= s.skip_similarity <= 1.0 for s in skips)
    assert any(s.skip_check == "max_consecutive_skips" for s in stats if not s.skipped)


def test_skip_checks_measure_the_hit_against_the_last_verified_tokens(vla, drafter, demo_store, helpers):
    """Every checked hit reports its distance to the tokens the last verified step executed (NaN
    before one), and the check reads exactly those: with them moved 50 bins away, every skip the
    unchanged run takes is refused as far from the verified motion."""
    loose = VerifySkipConfig(min_similarity=-1.0, min_similarity_bounds=(-1.0, 1.0), max_distance_m=0.2,
                             max_consecutive_skips=2, max_bins_from_verified=12)
    runs = {}
    for moved in (False, True):
        dec = _heisd(vla, drafter, demo_store, verify_skip=loose)
        obs = helpers.random_obs(3)
        dec.reset(obs.instruction)
        stats, verified = [], []
        for i in range(9):
            obs.ee_pos = np.array([0.0, 0.0, 0.001 * i]) + helpers.random_obs(3).ee_pos
            if moved and dec.last_verified_tokens is not None:
                t = dec.last_verified_tokens
                dec.last_verified_tokens = (t[0] + 50, *t[1:])
            verified.append(dec.last_verified_tokens)
            stats.append(dec.step(obs)[1])
        runs[moved] = (stats, verified)
    stats, verified = runs[False]
    before_any_measure = ("no_live_feature", "max_consecutive_skips")
    checked = [(s, v) for s, v in zip(stats, verified) if s.skip_check and s.skip_check not in before_any_measure]
    assert checked and all(math.isnan(s.skip_from_verified_bins) == (v is None) for s, v in checked)
    assert any(s.skipped for s in stats)
    moved = runs[True][0]
    assert not any(s.skipped for s in moved)
    assert any(s.skip_check == "far_from_verified" and s.skip_from_verified_bins >= 50 - 12 for s in moved)


def test_heisd_unknown_task_raises_or_falls_back(vla, drafter, demo_store, helpers):
    obs = helpers.random_obs(2, instruction="fly to the moon")
    with pytest.raises(UnknownTaskError, match="fly to the moon"):
        dec = _heisd(vla, drafter, demo_store)
        for _ in range(3):
            dec.step(obs)
    dec = _heisd(vla, drafter, demo_store, unknown_task="drafter")
    for _ in range(3):
        _, st = dec.step(obs)
    assert st.mode == "drafter" and "not in database" in st.fallback


def test_database_fault_mid_episode_falls_back_to_drafter_mode(vla, drafter, ar, helpers):
    """The real qdrant-client store fails mid-episode (closed under the decoder): the step is
    decoded in drafter mode with the fault recorded, and the decoder keeps working."""
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.schema import DemoPoint

    obs = helpers.random_obs(4)
    ref = helpers.ar_tokens(ar, obs)
    store = make_store(StoreConfig(backend="local"), obs_dim=128, feat_dim=vla.hidden_size, create=True)
    store.upsert([DemoPoint(dataset="f", task=obs.instruction, instruction=obs.instruction, episode=0, step=0,
                            obs=helpers.query(vla, obs), feat=np.ones(vla.hidden_size), feat_prev=np.ones(vla.hidden_size),
                            action=np.zeros(7), action_tokens=ref, ee_pos=obs.ee_pos)])
    dec = _heisd(vla, drafter, store, verify_skip=VerifySkipConfig(enabled=False))
    modes = [dec.step(obs)[1].mode for _ in range(3)]
    assert modes[-1] == "retrieval"
    store.close()  # the database goes away
    _, st = dec.step(obs)
    assert st.mode == "drafter" and st.fallback.startswith("database fault") and st.tokens == ref
    assert dec.health()[0] is False


def test_database_unreachable_through_the_real_client_falls_back(vla, drafter, helpers):
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.policy import PolicyPaths, open_store

    with pytest.raises(DatabaseUnavailableError):
        open_store(DecoderConfig(), PolicyPaths("tiny"), StoreConfig(backend="remote", url="http://127.0.0.1:1", timeout_s=0.3))


def test_empty_database_is_a_clear_error(vla, tmp_path):
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.policy import PolicyPaths, open_store
    from heisd_ros.store.factory import make_store

    store = make_store(StoreConfig(backend="edge", path=str(tmp_path / "db")), obs_dim=128, feat_dim=128, create=True)
    store.close()
    with pytest.raises(EmptyDatabaseError, match="empty"):
        open_store(DecoderConfig(), PolicyPaths("x", db_path=str(tmp_path / "db")), None)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: o.images.update(agentview=np.zeros((64, 64), np.uint8)), "uint8 \\[H, W, 3\\]"),
        (lambda o: o.images.update(agentview=np.zeros((64, 64, 3), np.float32)), "uint8"),
        (lambda o: o.images.pop("wrist"), "missing view"),
        (lambda o: setattr(o, "ee_pos", np.array([0.0, np.nan, 0.0])), "finite"),
        (lambda o: setattr(o, "ee_pos", np.array([0.0, 0.0])), "3 finite"),
        (lambda o: setattr(o, "instruction", "  "), "instruction"),
    ],
)
def test_bad_observations_raise_clear_errors(ar, helpers, mutate, message):
    obs = helpers.random_obs(5)
    mutate(obs)
    with pytest.raises(InvalidObservationError, match=message):
        ar.step(obs)


def test_bad_observation_leaves_decoder_usable(ar, helpers):
    bad = helpers.random_obs(6)
    bad.ee_pos = np.array([np.inf, 0, 0])
    with pytest.raises(InvalidObservationError):
        ar.step(bad)
    _, st = ar.step(helpers.random_obs(6))
    assert len(st.tokens) == 7


def test_methods_need_their_parts(vla):
    with pytest.raises(ConfigError, match="drafter"):
        HybridDecoder(vla, DecoderConfig(method="drafter"))
    with pytest.raises(ConfigError, match="database"):
        HybridDecoder(vla, DecoderConfig(method="retrieval"))
    with pytest.raises(ConfigError):
        DecoderConfig(method="beam")


def test_instruction_change_resets_the_window(ar, helpers):
    obs = helpers.random_obs(7)
    ar.reset()
    for _ in range(4):
        ar.step(obs)
    assert len(ar.metric) == 4
    other = dataclasses.replace(obs, instruction="open the drawer")
    ar.step(other)
    assert len(ar.metric) == 1


def test_core_imports_no_ros():
    code = "import sys, heisd_ros.core.engine, heisd_ros.policy; assert 'rclpy' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_step_returns_finite_unnormalised_action(ar, helpers):
    action, st = ar.step(helpers.random_obs(8))
    assert action.shape == (7,) and np.all(np.isfinite(action)) and action[6] in (-1.0, 1.0)
    assert set(st.latency_ms) >= {"vision", "verify", "total"}


def test_observation_type(helpers):
    assert isinstance(helpers.random_obs(0), Observation)


def test_remote_database_silent_mid_episode_falls_back_then_reconnects(vla, drafter, ar, helpers, qdrant_server):
    """The real qdrant-client path to a server that stops answering mid-episode: the step in
    flight waits at most timeout_s and is decoded in drafter mode (lossless: the AR tokens), later
    steps do not wait for the database at all, and retrieval comes back after the backoff."""
    import time

    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.reconnect import ReconnectingStore
    from heisd_ros.store.schema import DemoPoint

    obs = helpers.random_obs(11)
    ref = helpers.ar_tokens(ar, obs)
    # The backoff must outlast one decoding step even on a loaded machine (a step took > 0.5 s
    # there), else the "backing off" step below already makes its reconnect attempt.
    cfg = StoreConfig(backend="remote", url=qdrant_server.url, timeout_s=0.3, reconnect_backoff_s=2.0,
                      task_cache_ttl_s=0.0)  # fmt: skip
    with make_store(cfg, obs_dim=128, feat_dim=vla.hidden_size, create=True) as s:
        s.upsert([DemoPoint(dataset="f", task=obs.instruction, instruction=obs.instruction, episode=0, step=0,
                            obs=helpers.query(vla, obs), feat=np.ones(vla.hidden_size), feat_prev=np.ones(vla.hidden_size),
                            action=np.zeros(7), action_tokens=ref, ee_pos=obs.ee_pos)])  # fmt: skip
    store = ReconnectingStore(lambda: make_store(cfg, 128, vla.hidden_size), cfg, make_store(cfg))
    dec = _heisd(vla, drafter, store, verify_skip=VerifySkipConfig(enabled=False))
    assert [dec.step(obs)[1].mode for _ in range(3)][-1] == "retrieval"
    qdrant_server.pause()
    _, st = dec.step(obs)
    assert st.mode == "drafter" and st.fallback.startswith("database fault") and st.tokens == ref
    assert st.latency_ms["retrieval"] < 1e3 * cfg.timeout_s + 300
    _, st = dec.step(obs)  # backing off: no request, no wait
    assert st.mode == "drafter" and "reconnect attempt" in st.fallback and st.latency_ms["retrieval"] < 10
    assert dec.health()[0] is False
    qdrant_server.resume()
    time.sleep(store.retry_in_s + 0.05)
    _, st = dec.step(obs)
    assert st.mode == "retrieval" and st.fallback == "" and st.tokens == ref and store.reconnects == 1
    dec.close()


def test_instruction_change_resets_the_window_and_the_skip_state(vla, drafter, demo_store, helpers):
    skip = VerifySkipConfig(min_similarity=-1.0, min_similarity_bounds=(-1.0, 1.0), max_distance_m=0.2,
                            max_consecutive_skips=3)  # fmt: skip
    dec = _heisd(vla, drafter, demo_store, verify_skip=skip)
    obs = helpers.random_obs(3)
    modes = [dec.step(obs)[1].mode for _ in range(4)]
    assert modes == ["drafter", "drafter", "skip", "skip"] and dec.skip.consecutive_skips == 2
    # a new instruction mid-episode (same database partition, so retrieval and skipping stay possible)
    other = dataclasses.replace(obs, instruction="pick up the red bowl, then stop", task=obs.instruction)
    _, st = dec.step(other)
    # a fresh window (one position: F undefined -> drafter mode) and a fresh skip run; without the
    # reset this step would have been the third skip in a row
    assert dec.instruction == other.instruction and len(dec.metric) == 1 and st.mode == "drafter"
    assert dec.skip.consecutive_skips == 0 and dec.f_live is not None
    modes = [dec.step(other)[1].mode for _ in range(2)]
    assert modes[0] == "drafter" and modes[1] in ("retrieval", "skip")  # retrieval is back with 3 positions


FORWARD_COSTS = SourceChoiceConfig(min_retrieval_steps=3, probe_every_steps=5)


def _scrambled_store(vla, ar, helpers):
    """The demo database's observations with action tokens moved half the bin range away (gripper
    included): every draft is rejected at its first token, as with another operator's demonstrations."""
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.schema import DemoPoint

    first = vla.action_tokenizer.first_token_id
    store = make_store(StoreConfig(backend="local"), obs_dim=vla.vision_backbone.out_dim * 2, feat_dim=vla.hidden_size,
                       create=True)  # fmt: skip
    points = []
    for seed in range(12):
        obs = helpers.random_obs(seed)
        tokens = tuple(first + (t - first + 128) % 256 for t in helpers.ar_tokens(ar, obs))
        feat = np.random.default_rng(seed).normal(size=vla.hidden_size).astype(np.float32)
        points.append(DemoPoint(dataset="s", task=obs.instruction, instruction=obs.instruction, episode=seed, step=0,
                                obs=helpers.query(vla, obs), feat=feat, feat_prev=feat, action=np.zeros(7),
                                action_tokens=tokens, ee_pos=obs.ee_pos))  # fmt: skip
    store.upsert(points)
    return store


def _episode(decoder, helpers, n_steps=24):
    """n_steps over the database's observations, the hand moving 1 mm per step (F defined from step 3)."""
    out = []
    decoder.reset(helpers.random_obs(0).instruction)
    for i in range(n_steps):
        obs = helpers.random_obs(i % 12)
        obs.ee_pos = np.array([0.001 * i, 0.0, 0.1])
        out.append(decoder.step(obs)[1])
    return out


def test_mismatched_database_costs_no_more_forwards_than_the_drafter(vla, drafter, ar, helpers):
    store = _scrambled_store(vla, ar, helpers)
    on = _episode(_heisd(vla, drafter, store, source_choice=FORWARD_COSTS), helpers)
    off = _episode(_heisd(vla, drafter, store, source_choice=SourceChoiceConfig(enabled=False)), helpers)
    plain = _episode(HybridDecoder(vla, DecoderConfig(method="drafter"), drafter=drafter), helpers)
    store.close()
    runs = {"on": on, "off": off, "drafter": plain}
    fwd = {name: np.mean([s.llm_forwards for s in run]) for name, run in runs.items()}
    assert fwd["on"] <= fwd["drafter"] + 0.25, fwd
    # A rejected draft still fixes the prefill's own token, so forwards alone tie (the random test
    # drafter needs 7 either way); what mismatched retrieval adds is the query, the extra views and
    # the tree's width, charged here as half a forward per retrieval-mode step.
    cost = {name: np.mean([s.llm_forwards + 0.5 * (s.mode != "drafter") for s in run]) for name, run in runs.items()}
    assert cost["on"] <= cost["drafter"] + 0.15 < cost["off"], cost
    assert all(s.mode == "retrieval" for s in off[2:]) and all(s.tokens_per_forward[0] == 1 for s in off[2:])
    reasons = [s.source_reason for s in on]
    assert reasons[:2] == ["no_window"] * 2 and reasons[2:5] == ["learning"] * 3
    # after learning, retrieval only on probes (every 5th step routed away)
    assert reasons[5:] == (["retrieval_costlier"] * 4 + ["probe"]) * 3 + ["retrieval_costlier"] * 4
    assert [s.mode for s in on if s.source_reason == "retrieval_costlier"] == ["drafter"] * 16


def test_matching_database_keeps_retrieving_and_skipping(vla, drafter, demo_store, helpers):
    """On the database that holds these observations' own tokens, retrieval (verified in one forward,
    or skipped) stays cheaper than the drafter: the adaptive choice changes no step."""
    skip = VerifySkipConfig(min_similarity=-1.0, min_similarity_bounds=(-1.0, 1.0), max_distance_m=0.2)
    on = _episode(_heisd(vla, drafter, demo_store, verify_skip=skip, source_choice=FORWARD_COSTS), helpers)
    off = _episode(_heisd(vla, drafter, demo_store, verify_skip=skip, source_choice=SourceChoiceConfig(enabled=False)),
                   helpers)  # fmt: skip
    assert [s.mode for s in on] == [s.mode for s in off] and [s.tokens for s in on] == [s.tokens for s in off]
    assert {s.source_reason for s in on[5:]} == {"retrieval_cheaper"}
    assert sum(s.mode == "skip" for s in on) >= 6


def test_prepare_vision_builds_every_graph_a_step_uses(vla, drafter, demo_store, helpers):
    """A decoder whose steps embed the prompt's view (drafter mode) or every view (retrieval) gets
    both graphs before its first step, so that no timed step pays for building one."""
    dec = HybridDecoder(vla, DecoderConfig(method="heisd", fused_metric=FusedMetricConfig(tau=1e9)),
                        store=demo_store, drafter=drafter)  # its first step is a drafter step: the prompt's view
    dec.prepare_vision()
    built = set(dec.backbone._traces)
    assert {key[0][0] for key in built} == {vla.prompt_views, len(dec.cfg.views)}
    dec.step(helpers.random_obs(1))
    assert set(dec.backbone._traces) == built
    ar = HybridDecoder(vla, DecoderConfig(method="ar"))
    ar.prepare_vision()
    assert {key[0][0] for key in ar.backbone._traces} == {vla.prompt_views}
