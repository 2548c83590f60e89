"""`heisd calibrate --pin-tau / --pin-min-similarity`: a chosen operating point replaces the fitted one,
the fitted values stay in meta, and the node's loader applies the pinned values."""

from __future__ import annotations

import copy

import pytest

from heisd_ros.pipeline.calibration import apply_calibration, save_calibration
from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.tools.calibrate import CalibrateConfig, build_parser, pin_operating_point

FITTED = {
    "fused_metric": {"r_min_m": 0.001, "r_p95_m": 2.0, "d_min_m": 0.005, "d_p95_m": 0.2, "tau": 0.033},
    "verify_skip": {"enabled": False, "min_similarity": 0.9996, "max_distance_m": 0.0217},
    "meta": {"pass_rate": 0.72},
}


def test_pins_replace_fitted_values_and_keep_them_in_meta(tmp_path) -> None:
    calib = copy.deepcopy(FITTED)
    pin_operating_point(calib, 0.0, 0.99)
    assert calib["fused_metric"]["tau"] == 0.0
    assert calib["verify_skip"] == {"enabled": True, "min_similarity": 0.99, "max_distance_m": 0.0217}
    assert calib["meta"]["pinned"] == {
        "tau": {"fitted": 0.033, "pinned": 0.0},
        "min_similarity": {"fitted": 0.9996, "pinned": 0.99, "fitted_enabled": False},
    }
    save_calibration(calib, tmp_path / "cal.json")
    cfg = apply_calibration(DecoderConfig(), tmp_path / "cal.json")
    assert cfg.fused_metric.tau == 0.0
    assert cfg.verify_skip.enabled and cfg.verify_skip.min_similarity == 0.99
    assert cfg.verify_skip.max_distance_m == pytest.approx(0.0217)


def test_pinned_n_max_reaches_the_decoder_config(tmp_path) -> None:
    calib = copy.deepcopy(FITTED)
    pin_operating_point(calib, None, 0.98, 6)
    assert calib["verify_skip"]["max_consecutive_skips"] == 6
    save_calibration(calib, tmp_path / "cal.json")
    assert apply_calibration(DecoderConfig(), tmp_path / "cal.json").verify_skip.max_consecutive_skips == 6
    assert DecoderConfig().verify_skip.max_consecutive_skips == 3


def test_no_pins_change_nothing() -> None:
    calib = copy.deepcopy(FITTED)
    pin_operating_point(calib, None, None)
    assert calib == FITTED


def test_only_tau_pinned_leaves_verify_skip_as_fitted() -> None:
    calib = copy.deepcopy(FITTED)
    pin_operating_point(calib, 0.5, None)
    assert calib["fused_metric"]["tau"] == 0.5
    assert calib["verify_skip"] == FITTED["verify_skip"]
    assert set(calib["meta"]["pinned"]) == {"tau"}


@pytest.mark.parametrize("kw", [{"pin_tau": -0.1}, {"pin_tau": float("nan")}, {"pin_min_similarity": 0.2},
                                {"pin_min_similarity": 1.0}, {"pin_max_consecutive_skips": -1},
                                {"pin_max_consecutive_skips": 101}])
def test_out_of_range_pins_are_refused(kw) -> None:
    with pytest.raises(ConfigError):
        CalibrateConfig(**kw)


def test_cli_parses_the_pins() -> None:
    args = build_parser().parse_args(["--pin-tau", "0", "--pin-min-similarity", "0.99",
                                      "--pin-max-consecutive-skips", "6"])
    assert args.pin_tau == 0.0 and args.pin_min_similarity == 0.99 and args.pin_max_consecutive_skips == 6
    assert build_parser().parse_args([]).pin_tau is None
