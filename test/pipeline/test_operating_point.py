"""The operating-point file: every decoder setting of a point, applied whole, and the shipped one is
the one a committed report measured."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from heisd_ros.core.config import (
    DecoderConfig,
    RetrievalConfig,
    SourceChoiceConfig,
    VerifySkipConfig,
    from_dict,
    to_dict,
)
from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.calibration import (
    NOT_IN_POINT,
    POINT_SCALARS,
    POINT_SECTIONS,
    POINT_VERSION,
    apply_point,
    complete_point,
    point_settings,
)
from heisd_ros.pipeline.outputs import file_digest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_POINT = ROOT / "models" / "mini_libero" / "calibration.json"


def _unusual() -> DecoderConfig:
    """A configuration whose point settings all differ from the defaults somewhere."""
    d = DecoderConfig()
    return dataclasses.replace(
        d, gripper_hold_steps=2,
        retrieval=RetrievalConfig(top_k=4, max_tree_nodes=20, query_views=1, position_pool=16),
        verify_skip=dataclasses.replace(d.verify_skip, min_similarity=0.97, max_bins_from_verified=12,
                                        max_hit_spread_bins=9, gripper_lookahead_steps=2, state_path="/tmp/x.json"),
        source_choice=SourceChoiceConfig(smoothing=0.3, retrieval_overhead_forwards=0.5),
        fused_metric=dataclasses.replace(d.fused_metric, tau=0.3, d_p95_m=0.25),
        acceptance=dataclasses.replace(d.acceptance, max_group_bias_bins=24),
        drafter_tree=dataclasses.replace(d.drafter_tree, depth=4))


def test_a_point_file_carries_every_setting_and_applies_whole():
    cfg = _unusual()
    point = json.loads(json.dumps(complete_point({}, cfg)))  # through JSON, as the file is
    assert point["version"] == POINT_VERSION
    applied = apply_point(DecoderConfig(), point)
    for name in POINT_SECTIONS:
        expected = to_dict(getattr(cfg, name))
        for field in NOT_IN_POINT.get(name, ()):
            expected[field] = to_dict(getattr(DecoderConfig(), name))[field]  # a deployment's, not the point's
        assert to_dict(getattr(applied, name)) == expected, name
    assert all(getattr(applied, s) == getattr(cfg, s) for s in POINT_SCALARS)
    assert "state_path" not in point["verify_skip"]


def test_every_field_of_a_point_section_is_in_the_file():
    """A field added to a section reaches the file unless it is declared a deployment's."""
    point = point_settings(DecoderConfig())
    for name, cls in POINT_SECTIONS.items():
        fields = {f.name for f in dataclasses.fields(cls)} - set(NOT_IN_POINT.get(name, ()))
        assert set(point[name]) == fields, name


def test_a_partial_file_changes_only_what_it_gives():
    cfg = apply_point(DecoderConfig(), {"retrieval": {"position_pool": 20}, "gripper_hold_steps": 1})
    assert cfg.retrieval == RetrievalConfig(position_pool=20)
    assert cfg.gripper_hold_steps == 1 and cfg.verify_skip == VerifySkipConfig()


@pytest.mark.parametrize("bad, why", [
    ({"version": 3}, "version"),
    ({"retreival": {"top_k": 3}}, "unknown operating-point keys"),
    ({"retrieval": {"top_kk": 3}}, "unknown keys"),
    ({"retrieval": {"top_k": 0}}, "top_k"),
    ({"source_choice": {"cost_signal": "latency_ms"}}, "unknown keys"),
    ({"retrieval": 5}, "must be an object"),
])
def test_a_bad_point_is_refused_with_the_reason(bad, why):
    with pytest.raises(ConfigError, match=why):
        apply_point(DecoderConfig(), bad)


def test_an_explicit_skip_off_wins_over_the_file():
    off = DecoderConfig(verify_skip=VerifySkipConfig(enabled=False))
    assert not apply_point(off, {"verify_skip": {"enabled": True, "min_similarity": 0.97}}).verify_skip.enabled


def test_the_online_stage_is_the_deployments_never_a_point_files():
    """No figure is measured with episode feedback: a file cannot turn it on, nor off where it runs."""
    file = {"verify_skip": {"online": True, "min_similarity": 0.97}}
    assert not apply_point(DecoderConfig(), file).verify_skip.online
    on = DecoderConfig(verify_skip=VerifySkipConfig(online=True))
    assert apply_point(on, {"verify_skip": {"online": False}}).verify_skip.online
    assert "online" not in json.loads(SHIPPED_POINT.read_text())["verify_skip"]


def test_the_shipped_point_is_complete():
    point = json.loads(SHIPPED_POINT.read_text())
    assert point["version"] == POINT_VERSION
    assert point_settings(apply_point(DecoderConfig(), point)) == {k: point[k] for k in point_settings(DecoderConfig())}
    assert point["chosen_from"]["kind"] in ("libero_run", "shadow_recordings", "demonstrations")
def _node_decoder_config(model_dir: Path, point: Path) -> DecoderConfig:
    """The decoder configuration the node runs with config/policy.yaml and a published policy's files
    (the database adds nothing: the point names its query views)."""
    from heisd_ros.policy import PolicyPaths, resolve_decoder_config
    from heisd_ros.ros.params import build_config

    params = yaml.safe_load((ROOT / "config" / "policy.yaml").read_text())["/**"]["ros__parameters"]

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
        return out

    values = {**flat(params), "model_dir": str(model_dir), "calibration_path": str(point)}
    decoder = build_config(values).decoder
    paths = PolicyPaths(model_dir=str(model_dir), calibration_path=str(point))
    return resolve_decoder_config(decoder, paths)


@pytest.mark.parametrize("published, headline", [("mini_libero", "libero_object.json"),
                                                  ("mini_libero_spatial", "libero_spatial.json")])
def test_the_node_runs_the_point_a_committed_report_measured(published, headline):
    """What ships is what was measured: for each published policy, its suite's committed LIBERO report
    ran with its point file (same digest), and the node's effective decoder configuration equals that
    report's."""
    point = ROOT / "models" / published / "calibration.json"
    digest = file_digest(str(point))
    reports = []
    for path in sorted((ROOT / "benchmarks").glob("libero_*.json")):
        model = json.loads(path.read_text()).get("_meta", {}).get("model", {})
        if model.get("calibration_digest") == digest:
            reports.append((path.name, model["decoder_config"]))
    assert reports, f"no committed report ran {published}'s point (digest {digest})"
    # the suite's headline (README): the run that counts is the report of what ships
    assert headline in [name for name, _ in reports], [name for name, _ in reports]
    node = to_dict(_node_decoder_config(ROOT / "models" / published / "vla", point).with_method("heisd"))
    for name, measured in reports:
        assert to_dict(from_dict(DecoderConfig, measured)) == node, name
