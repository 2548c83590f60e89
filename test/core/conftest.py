"""Shared tiny models and observations for the decoding-core tests (fp32, CPU, fixed seeds)."""

from __future__ import annotations

import pytest
import torch

from heisd_ros.models.loader import tiny_vla

VIEWS = ("agentview", "wrist")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def vla():
    return tiny_vla(seed=0)

