"""Training loops (pipeline/training.py): bf16 autocast only where the CPU is fast at it."""

from __future__ import annotations


def test_bf16_autocast_is_chosen_by_the_cpu_flags(tmp_path):
    """bf16 autocast only where the CPU multiplies bf16 natively; elsewhere it is emulated (slower)."""
    from heisd_ros.pipeline.training import cpu_has_fast_bf16
    from heisd_ros.tools.train_drafter import TrainDrafterConfig

    def cpuinfo(flags: str):
        path = tmp_path / f"cpuinfo_{abs(hash(flags))}"
        path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
        return str(path)

    assert not cpu_has_fast_bf16(cpuinfo("avx2 avx512f"))
    assert cpu_has_fast_bf16(cpuinfo("avx512f avx512_bf16"))
    assert cpu_has_fast_bf16(cpuinfo("amx_tile amx_bf16"))
    assert not cpu_has_fast_bf16(str(tmp_path / "missing"))
    # The default resolves to the machine's answer and is recorded; the flags override it.
    assert TrainDrafterConfig().bf16_autocast is cpu_has_fast_bf16()
