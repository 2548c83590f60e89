"""`heisd check-model` on a tiny OpenVLA-layout checkpoint and on the tiny VLA: the checks pass and
the table prints; a checkpoint that cannot load exits 2; a model that ignores its images, or a
"strict" method that is not lossless, fails its check (exit 1)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from heisd_ros.core.config import AcceptanceConfig
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.models.loader import tiny_vla
from heisd_ros.models.openvla_random import PRESETS, write_random_checkpoint
from heisd_ros.tools import check_model
from heisd_ros.tools.check_model import main

FAST = ["--threads", "1", "--images", "4", "--steps", "2"]
CHECKS = ["images", "drafter", "retrieval", "heisd", "actions"]


@pytest.fixture(scope="module")
def openvla_dir(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("openvla") / "tiny", PRESETS["tiny"])["directory"]


@pytest.fixture(scope="module")
def vla_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vla") / "tiny"
    tiny_vla().save_pretrained(directory)
    return str(directory)


def _report(path) -> dict:
    return json.loads(path.read_text())


def test_openvla_checkpoint_passes_and_the_table_prints(openvla_dir, tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main([openvla_dir, "--unnorm-key", "bridge_orig", "--json", str(out)] + FAST) == 0
    text = capsys.readouterr().out
    for name in CHECKS:
        assert any(line.startswith(name) and " pass " in line for line in text.splitlines()), (name, text)
    for method in ("ar", "drafter", "heisd"):
        assert any(line.startswith(method + " ") and line.rstrip().endswith("x") for line in text.splitlines())
    assert "speedup" in text and "all checks passed" in text
    report = _report(out)
    assert report["passed"] and [c["name"] for c in report["checks"]] == CHECKS
    assert report["model"]["model_type"] == "openvla" and report["model"]["drafter"] == "untrained drafter"
    assert report["checks"][0]["figures"]["pairs"] == 6
    retrieval = report["checks"][2]["figures"]
    assert retrieval["equal"] == 4 and retrieval["modes"] == {"retrieval": 4}
    assert report["checks"][3]["figures"]["modes"] == {"drafter": 8, "retrieval": 4}
    ar, drafter = report["timing"]["ar"], report["timing"]["drafter"]
    assert ar["steps"] == 2 and ar["forwards_per_step"] == 7.0 and ar["speedup_vs_ar"] == 1.0
    assert drafter["speedup_vs_ar"] == pytest.approx(ar["mean_step_ms"] / drafter["mean_step_ms"])
    for key in ("mean_step_ms", "median_step_ms", "p95_step_ms"):
        assert drafter[key] > 0


def test_tiny_vla_passes(vla_dir, tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main([vla_dir, "--json", str(out), "--steps", "0"] + FAST[:4]) == 0
    report = _report(out)
    assert report["model"]["model_type"] == "heisd_vla" and report["timing"] == {}
    assert all(c["passed"] for c in report["checks"])
    assert "method" not in capsys.readouterr().out  # no timing table with --steps 0


def test_a_trained_drafter_directory_is_used(vla_dir, tmp_path):
    from heisd_ros.core.drafter import EagleDrafter
    from heisd_ros.models.loader import load_vla

    torch.manual_seed(1)
    EagleDrafter(load_vla(vla_dir).language_model.config).save(tmp_path / "drafter")
    out = tmp_path / "check.json"
    assert main([vla_dir, "--drafter", str(tmp_path / "drafter"), "--json", str(out)] + FAST) == 0
    assert _report(out)["model"]["drafter"] == f"drafter {tmp_path / 'drafter'}"


def test_load_errors_exit_2_with_the_reason(openvla_dir, vla_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(openvla_dir, broken)
    next(broken.glob("model-00002-*.safetensors")).unlink()
    assert main([str(broken), "--unnorm-key", "bridge_orig"] + FAST) == 2
    assert "cannot load" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere")] + FAST) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main([openvla_dir, "--unnorm-key", "mars"] + FAST) == 2
    assert "bridge_orig" in capsys.readouterr().err  # the known keys are listed
    assert main([openvla_dir] + FAST) == 2  # two datasets and no key
    assert "unnorm_key" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([vla_dir, "--drafter", str(tmp_path / "empty")] + FAST) == 2
    assert "drafter" in capsys.readouterr().err


def test_a_model_blind_to_its_images_fails(tmp_path, capsys):
    vla = tiny_vla()
    with torch.no_grad():
        for p in vla.projector.parameters():
            p.zero_()
    vla.save_pretrained(tmp_path / "blind")
    out = tmp_path / "check.json"
    assert main([str(tmp_path / "blind"), "--json", str(out)] + FAST) == 1
    images = _report(out)["checks"][0]
    assert not images["passed"] and images["figures"]["differing_pairs"] == 0
    assert "a check FAILED" in capsys.readouterr().out


@pytest.fixture
def relaxed_heisd(monkeypatch):
    """heisd built with its default (relaxed) acceptance: the 3-bin-shifted database drafts pass it."""
    real = check_model.Session.decoder

    def decoder(self, method, store=None, with_prior=True):
        dec = real(self, method, store, with_prior)
        if method != "heisd":
            return dec
        cfg = dataclasses.replace(dec.cfg, acceptance=AcceptanceConfig())
        return HybridDecoder(self.vla, cfg, store=store, drafter=self.drafter, state_prior=dec.state_prior)

    monkeypatch.setattr(check_model.Session, "decoder", decoder)


def test_a_strict_method_that_is_not_lossless_fails(relaxed_heisd, vla_dir, tmp_path):
    out = tmp_path / "check.json"
    assert main([vla_dir, "--json", str(out)] + FAST) == 1
    heisd = _report(out)["checks"][3]
    assert not heisd["passed"] and "MISMATCH" in heisd["detail"]
    differ = 12 - heisd["figures"]["equal"]  # 4 frames x 3 steps; some shifted drafts were accepted
    assert differ > 0 and heisd["figures"]["largest_margin"] > 1e-3
    # Within a (deliberately huge) tie tolerance the same differences count as near-ties.
    assert main([vla_dir, "--json", str(out), "--tie-tolerance", "1e9"] + FAST) == 0
    heisd = _report(out)["checks"][3]
    assert heisd["passed"] and heisd["figures"]["near_ties"] == differ and "near-tie" in heisd["detail"]


def test_the_command_is_registered():
    from heisd_ros.tools.cli import COMMANDS

    assert COMMANDS["check-model"][0] == "heisd_ros.tools.check_model"
