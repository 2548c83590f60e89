"""Model loading: round trip of the on-disk form, and clear errors for bad files."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from heisd_ros.core.errors import ModelLoadError
from heisd_ros.models.loader import load_vla, tiny_vla
from heisd_ros.models.openvla import check_checkpoint_dir, load_openvla


def test_save_load_round_trip_gives_identical_outputs(tmp_path):
    model = tiny_vla(seed=3)
    model.save_pretrained(tmp_path / "m")
    back = load_vla(tmp_path / "m")
    img = [np.full((64, 64, 3), 90, np.uint8)]
    with torch.inference_mode():
        a = model.projector(model.vision_backbone(model.preprocess(img)))
        b = back.projector(back.vision_backbone(back.preprocess(img)))
        assert torch.equal(a, b)
        assert torch.equal(model.action_head_weight(), back.action_head_weight())
    assert back.action_head_weight().shape == (256, model.hidden_size)


def test_missing_and_corrupt_files_name_the_file(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_vla(tmp_path)
    tiny_vla().save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_vla(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{broken")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_vla(tmp_path / "m")


def test_mismatched_shapes_are_reported(tmp_path):
    tiny_vla(hidden_size=64).save_pretrained(tmp_path / "small")
    big = tiny_vla(hidden_size=128)
    big.save_pretrained(tmp_path / "big")
    (tmp_path / "big" / "model.safetensors").write_bytes((tmp_path / "small" / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match="shape"):
        load_vla(tmp_path / "big")


def test_openvla_directory_is_validated_before_transformers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "openvla"}))
    with pytest.raises(ModelLoadError, match="dataset_statistics.json"):
        load_vla(tmp_path)
    (tmp_path / "dataset_statistics.json").write_text(json.dumps({"bridge": {"action": {"q01": [0] * 7, "q99": [1] * 7}}}))
    with pytest.raises(ModelLoadError, match="safetensors"):
        check_checkpoint_dir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="timm_model_ids"):  # the config names no architecture
        load_openvla(tmp_path)


def _edit_config(directory, **changes) -> None:
    path = directory / "config.json"
    meta = json.loads(path.read_text())
    meta["heisd_vla"].update(changes)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("key, off, on", [("proprio_prev_gripper", False, True), ("proprio_gripper_dwell", 0, 16),
                                          ("proprio_fourier", 0, 6)])
def test_retired_config_keys_load_when_off_and_are_refused_when_on(tmp_path, key, off, on):
    """Checkpoints of earlier versions carry retired keys: at their off value they load as before,
    switched on they name the key instead of running a different model."""
    model = tiny_vla(seed=3)
    model.save_pretrained(tmp_path / "m")
    _edit_config(tmp_path / "m", **{key: off})
    back = load_vla(tmp_path / "m")
    assert back.cfg == model.cfg
    with torch.inference_mode():
        assert torch.equal(back.action_head_weight(), model.action_head_weight())
    _edit_config(tmp_path / "m", **{key: on})
    with pytest.raises(ModelLoadError, match=f"{key} = {on!r} was retired in this version"):
        load_vla(tmp_path / "m")


def test_an_older_checkpoint_with_every_retired_key_off_loads(tmp_path):
    tiny_vla(seed=1).save_pretrained(tmp_path / "m")
    _edit_config(tmp_path / "m", proprio_prev_gripper=False, proprio_gripper_dwell=0, proprio_fourier=0)
    assert load_vla(tmp_path / "m").cfg == tiny_vla(seed=1).cfg


def test_the_retired_multiscale_backbone_is_named(tmp_path):
    tiny_vla().save_pretrained(tmp_path / "m")
    _edit_config(tmp_path / "m", vision="efficientnet_lite0_ms")
    with pytest.raises(ModelLoadError, match="'efficientnet_lite0_ms' was retired in this version"):
        load_vla(tmp_path / "m")


def test_unknown_config_keys_are_still_refused(tmp_path):
    tiny_vla().save_pretrained(tmp_path / "m")
    _edit_config(tmp_path / "m", proprio_wobble=0)
    with pytest.raises(ModelLoadError, match="proprio_wobble"):
        load_vla(tmp_path / "m")


# --- safetensors sizes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "m"
    tiny_vla(seed=1).save_pretrained(d)
    return d


def _header_length(raw: bytearray, value: int) -> None:
    raw[:8] = struct.pack("<Q", value)


def _tensor_past_the_file(raw: bytearray, span: int = 1 << 40) -> None:
    """The first tensor's data offsets moved past the file's end (the header rewritten whole, its
    length with it; the data after it unchanged)."""
    length = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = [span, span + 4]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    raw[: 8 + length] = struct.pack("<Q", len(text)) + text


SAFETENSORS_DAMAGE = {
    "header length 2**60": (lambda raw: _header_length(raw, 1 << 60), "header too large"),
    "header length past the file": (lambda raw: _header_length(raw, len(raw)), "invalid header length"),
    "tensor offsets past the file": (_tensor_past_the_file, "invalid .*offset"),
}


@pytest.mark.parametrize("case", list(SAFETENSORS_DAMAGE))
@pytest.mark.parametrize("reader", ["load_vla", "read_layout"])
def test_a_safetensors_size_beyond_the_file_is_a_model_load_error(tiny_model_dir, tmp_path, case, reader):
    """safetensors (0.8) checks the header length against its 100 MB cap and the file, and every
    tensor's offsets against the file, before it allocates: the loaders turn its refusal into a
    ModelLoadError naming the file (this pins both)."""
    from heisd_ros.models.openvla_weights import read_layout

    damage, words = SAFETENSORS_DAMAGE[case]
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    raw = bytearray((d / "model.safetensors").read_bytes())
    damage(raw)
    (d / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ModelLoadError, match=words) as info:
        (load_vla if reader == "load_vla" else read_layout)(d)
    assert f"corrupt weights file {d / 'model.safetensors'}" in str(info.value)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(0, (1 << 64) - 1))
@example(length=1 << 60)
@example(length=(1 << 64) - 1)
def test_any_header_length_reads_or_is_a_model_load_error(tiny_model_dir, tmp_path_factory, length):
    from heisd_ros.models.openvla_weights import read_layout

    d = tmp_path_factory.mktemp("header")
    raw = bytearray((tiny_model_dir / "model.safetensors").read_bytes())
    intact = struct.unpack_from("<Q", raw)[0]
    _header_length(raw, length)
    (d / "model.safetensors").write_bytes(bytes(raw))
    try:
        read_layout(d)
    except ModelLoadError as err:
        assert str(d / "model.safetensors") in str(err)
    else:
        assert length == intact
