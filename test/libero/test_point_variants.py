"""`shadow_point_report --variants`: the eval-libero variants that run a chosen point beside the shipped
one (scripts/shadow_point_eval.sh, scripts/libero_spatial_eval.sh).

What it would have caught: a LIBERO-path point that differs from the shipped one only in the
boundary's tau dropped as "the same point", so its comparison never runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.config import DecoderConfig, to_dict
from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.method_variants import parse_variants
from heisd_libero.shadow_point_report import point_variants


def _point(path: Path, tau: float = 0.0, n_max: int = 3, lookahead: int = 0) -> str:
    d = to_dict(DecoderConfig())
    d["fused_metric"]["tau"], d["verify_skip"]["max_consecutive_skips"] = tau, n_max
    d["verify_skip"]["gripper_lookahead_steps"] = lookahead
    path.write_text(json.dumps(d))
    return str(path)


def test_a_point_runs_beside_the_shipped_one_only_where_it_differs(tmp_path: Path) -> None:
    shipped = Path(_point(tmp_path / "shipped.json"))
    same, tau, nmax = _point(tmp_path / "same.json"), _point(tmp_path / "tau.json", tau=0.4), \
        _point(tmp_path / "nmax.json", n_max=2)  # fmt: skip
    look = _point(tmp_path / "look.json", lookahead=3)
    methods, variants = point_variants(shipped, [f"s={same}", f"t={tau}", f"n={nmax}", f"g={look}"])
    assert methods == "ar,heisd,t,n,g"
    parsed = {v.name: v for v in parse_variants(variants)}
    assert set(parsed) == {"t", "n", "g"}
    assert parsed["t"].overrides == (("fused_metric.tau", 0.4),)  # only what differs
    assert parsed["g"].config(DecoderConfig()).verify_skip.gripper_lookahead_steps == 3
    assert parsed["t"].config(DecoderConfig()).fused_metric.tau == 0.4
    assert parsed["n"].config(DecoderConfig()).verify_skip.max_consecutive_skips == 2
    assert point_variants(shipped, []) == ("ar,heisd", "")


def test_a_point_that_differs_in_a_list_field_is_refused(tmp_path: Path) -> None:
    shipped = Path(_point(tmp_path / "shipped.json"))
    d = json.loads(shipped.read_text())
    d["verify_skip"]["min_similarity_bounds"] = [0.6, 0.99]
    (tmp_path / "b.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="min_similarity_bounds"):
        point_variants(shipped, [f"b={tmp_path / 'b.json'}"])
