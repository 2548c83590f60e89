"""Training-time image augmentation and the backbone's learning-rate group (models/training.py)."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.pipeline.training import Example, _augmented, random_shift


def test_random_shift_moves_content_within_bounds_and_keeps_shape():
    img = np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(50):
        (out,) = random_shift([img], 2, rng)
        assert out.shape == img.shape and out.dtype == np.uint8
        # the interior of the output is the original moved by some (dy, dx) in [-2, 2]^2
        match = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                 if np.array_equal(out[2:-2, 2:-2], img[2 - dy : 14 - dy, 2 - dx : 14 - dx])]
        assert match, "output is not a shift of the input"
        seen.add(match[0])
    assert len(seen) > 10  # the shifts vary
    a = random_shift([img], 2, np.random.default_rng(3))[0]
    b = random_shift([img], 2, np.random.default_rng(3))[0]
    assert np.array_equal(a, b)  # seeded
    assert np.array_equal(random_shift([img], 0, rng)[0], img)


def test_augmentation_needs_images_not_cached_patches():
    ex = Example([np.zeros((8, 8, 3), np.uint8)], "pick", np.zeros(7, np.int64))
    out = _augmented([ex], 2, np.random.default_rng(0))
    assert out[0].images[0].shape == (8, 8, 3) and out[0] is not ex and ex.images[0].sum() == 0
    assert _augmented([ex], 0, np.random.default_rng(0))[0] is ex
    cached = Example([], "pick", np.zeros(7, np.int64), patches=np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="cached patches"):
        _augmented([cached], 2, np.random.default_rng(0))


def test_bf16_autocast_is_chosen_by_the_cpu_flags(tmp_path):
    """bf16 autocast only where the CPU multiplies bf16 natively; elsewhere it is emulated (slower)."""
    from heisd_ros.pipeline.training import cpu_has_fast_bf16
    from heisd_ros.tools.train_drafter import TrainDrafterConfig
    from heisd_ros.tools.train_vla import TrainVLAConfig, build_parser

    def cpuinfo(flags: str):
        path = tmp_path / f"cpuinfo_{abs(hash(flags))}"
        path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
        return str(path)

    assert not cpu_has_fast_bf16(cpuinfo("avx2 avx512f"))
    assert cpu_has_fast_bf16(cpuinfo("avx512f avx512_bf16"))
    assert cpu_has_fast_bf16(cpuinfo("amx_tile amx_bf16"))
    assert not cpu_has_fast_bf16(str(tmp_path / "missing"))
    # The default resolves to the machine's answer and is recorded; the flags override it.
    assert TrainVLAConfig().bf16_autocast is cpu_has_fast_bf16()
    assert TrainDrafterConfig().bf16_autocast is cpu_has_fast_bf16()
    assert build_parser().parse_args(["--fp32"]).bf16_autocast is False
    assert build_parser().parse_args(["--bf16"]).bf16_autocast is True
    assert build_parser().parse_args([]).bf16_autocast is None
