"""`heisd-libero publish-mini`: the committed compact copy of the mini policy, written and updated.
(The committed copy itself, as the node loads it: test/tools/test_demo_model.py.)"""

from __future__ import annotations

import pytest

from heisd_ros.core.errors import ConfigError


def test_publish_mini_round_trip(tmp_path) -> None:
    """publish-mini writes bf16 weights that load and decode like the source (same greedy tokens
    on most inputs: rounding to bf16 may move a near-tie), plus a manifest of digests."""
    import json

    import numpy as np
    import torch

    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.drafter import EagleDrafter, load_drafter
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.models.loader import load_vla, tiny_vla
    from heisd_ros.pipeline.synthetic_demos import random_observation
    from heisd_ros.pipeline.libero_runs import published_paths, published_present
    from heisd_libero.publish_mini import PublishConfig, publish

    torch.set_num_threads(1)
    vla = tiny_vla(seed=2)
    vla.save_pretrained(tmp_path / "vla")
    EagleDrafter(vla.language_model.config).save(tmp_path / "drafter")
    from heisd_ros.pipeline.calibration import complete_point

    def point(tau: float) -> str:  # a complete operating point at this tau
        return json.dumps(complete_point({"fused_metric": {"tau": tau}}, DecoderConfig()))

    (tmp_path / "cal.json").write_text(point(0.5))
    out = tmp_path / "pub"
    manifest = publish(PublishConfig(str(tmp_path / "vla"), str(tmp_path / "drafter"), str(tmp_path / "cal.json"), str(out)))
    assert published_present(out) and (out / "manifest.json").is_file()
    assert set(manifest["files"]) >= {"vla/model.safetensors", "drafter/drafter.safetensors", "calibration.json"}
    paths = published_paths(out)
    back = load_vla(paths["model_dir"])
    assert all(p.dtype == torch.float32 for p in back.parameters())  # loaded into the asked dtype
    load_drafter(paths["drafter_dir"], back.language_model.config)
    same = 0
    a, b = HybridDecoder(vla, DecoderConfig(method="ar")), HybridDecoder(back, DecoderConfig(method="ar"))
    for seed in range(6):
        obs = random_observation(seed)
        same += a.step(obs)[1].tokens == b.step(obs)[1].tokens
    assert same >= 4
    (tmp_path / "partial.json").write_text(json.dumps({"fused_metric": {"tau": 0.5}, "verify_skip": {}}))
    with pytest.raises(ConfigError, match="not a complete operating point"):
        publish(PublishConfig(str(tmp_path / "vla"), str(tmp_path / "drafter"), str(tmp_path / "partial.json"), str(out)))
    with pytest.raises(ConfigError, match="complete operating point"):
        (tmp_path / "bad.json").write_text("[]")
        publish(PublishConfig(str(tmp_path / "vla"), str(tmp_path / "drafter"), str(tmp_path / "bad.json"), str(out)))
    assert published_present(out)  # a refused publish leaves the old copy
    np.testing.assert_equal(json.loads((out / "calibration.json").read_text())["fused_metric"]["tau"], 0.5)

    # --calibration-only: the new point replaces the old, the weights keep their bytes, the manifest follows
    import hashlib

    from heisd_libero.publish_mini import main as publish_main
    (tmp_path / "point.json").write_text(point(0.02))
    assert publish_main(["--calibration-only", "--calibration", str(tmp_path / "point.json"), "--out", str(out)]) == 0
    after = json.loads((out / "manifest.json").read_text())
    assert json.loads((out / "calibration.json").read_text())["fused_metric"]["tau"] == 0.02
    assert after["files"]["vla/model.safetensors"] == manifest["files"]["vla/model.safetensors"]
    assert after["files"]["calibration.json"] != manifest["files"]["calibration.json"]
    for rel, digest in after["files"].items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest, rel
    assert "--calibration-only" in after["calibration_update"]["command"]
    assert publish_main(["--calibration-only", "--calibration", str(tmp_path / "bad.json"), "--out", str(out)]) == 2
    assert publish_main(["--calibration-only", "--calibration", str(tmp_path / "point.json"),
                         "--out", str(tmp_path / "nothing")]) == 2
    assert json.loads((out / "calibration.json").read_text())["fused_metric"]["tau"] == 0.02
