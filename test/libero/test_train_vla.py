"""`heisd-libero train-vla` settings that need no training: bf16 autocast and the finger-gap state token."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.training import cpu_has_fast_bf16

from heisd_libero.train_vla import TrainVLAConfig, build_parser


def test_bf16_autocast_defaults_to_the_machines_answer_and_the_flags_override_it():
    assert TrainVLAConfig().bf16_autocast is cpu_has_fast_bf16()
    assert build_parser().parse_args(["--fp32"]).bf16_autocast is False
    assert build_parser().parse_args(["--bf16"]).bf16_autocast is True
    assert build_parser().parse_args([]).bf16_autocast is None


def test_train_vla_refuses_a_gap_without_the_state_token():
    from heisd_libero.train_vla import mini_vla_config

    with pytest.raises(ConfigError, match="gripper-gap"):
        TrainVLAConfig(gripper_gap=True)
    cfg = TrainVLAConfig(proprio=True, gripper_gap=True)
    assert mini_vla_config(cfg, np.random.default_rng(0).normal(size=(10, 3))).proprio_gripper_gap
