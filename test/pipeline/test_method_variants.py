"""Method variants (heisd_ros.pipeline.method_variants): a method with some DecoderConfig fields
changed, as eval-libero runs them and choose-point reads them back."""

from __future__ import annotations

import pytest

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.method_variants import parse_variants


def test_variant_changes_only_its_fields() -> None:
    base = DecoderConfig()
    tau0, noskip, point = parse_variants(
        "heisd_tau0=heisd:fused_metric.tau=0; heisd_noskip=heisd:verify_skip.enabled=false;"
        "s98=heisd:verify_skip.min_similarity=0.98,verify_skip.max_consecutive_skips=6")
    assert tau0.config(base).fused_metric.tau == 0 and tau0.config(base).verify_skip == base.verify_skip
    assert noskip.config(base).verify_skip.enabled is False and noskip.config(base).fused_metric == base.fused_metric
    cfg = point.config(base)
    assert (cfg.verify_skip.min_similarity, cfg.verify_skip.max_consecutive_skips, cfg.method) == (0.98, 6, "heisd")
    # the recorded spec parses back to the same variant
    assert parse_variants(point.describe()) == (point,)
    assert parse_variants("") == ()


@pytest.mark.parametrize("spec, match", [
    ("ar=heisd", "own name"),
    ("x=fast", "unknown method"),
    ("x=heisd:fused_metric.nope=1", "not a DecoderConfig field"),
    ("x=heisd:nope.tau=1", "not a DecoderConfig field"),
    ("x=heisd:fused_metric.tau", "not field=value"),
    ("x=heisd:fused_metric.tau=abc", "not a JSON value"),
    ("x=heisd;x=ar", "distinct"),
    ("1x=heisd", "identifier"),
])
def test_bad_variant_specs_are_refused(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        for v in parse_variants(spec):
            v.config(DecoderConfig())


def test_out_of_range_override_fails_validation() -> None:
    (v,) = parse_variants("x=heisd:verify_skip.max_consecutive_skips=1000")
    with pytest.raises(ConfigError):
        v.config(DecoderConfig())
