"""Sealed evaluation scenes of `heisd-libero eval-libero` without the simulator: how a pair's object shift is
derived, that every method of a pair gets the same one, and where the run records it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fake_decoder import FakeDecoder

from heisd_ros.core.errors import ConfigError
from heisd_libero.sim.libero_env import scene_shift_seed, shift_sources, xy_shifts_m
from heisd_libero import eval_libero
from heisd_libero.eval_config import EvalLiberoConfig
from heisd_libero.eval_episodes import run_pair
from heisd_libero.eval_report import ResultLog


def test_a_pairs_shift_is_a_function_of_seed_task_and_init_state_only() -> None:
    first = scene_shift_seed(7, 3, 41)
    for other in [(8, 3, 41), (7, 4, 41), (7, 3, 42)]:  # another scene seed, task or init state
        scene_shift_seed(*other)
    assert scene_shift_seed(7, 3, 41) == first  # nothing drawn before changes it
    seeds = {scene_shift_seed(s, t, k) for s in range(3) for t in range(10) for k in range(40, 50)}
    assert len(seeds) == 3 * 10 * 10  # every (seed, task, init state) its own scene
    shifts = xy_shifts_m(0.02, first, 7)
    np.testing.assert_array_equal(shifts, xy_shifts_m(0.02, first, 7))
    assert shifts.shape == (7, 2) and np.abs(shifts).max() <= 0.02 and np.abs(shifts).min() > 0
    assert not np.allclose(shifts, xy_shifts_m(0.02, scene_shift_seed(8, 3, 41), 7))
    np.testing.assert_array_equal(xy_shifts_m(0.0, first, 7), np.zeros((7, 2)))  # D = 0: no shift at all


def test_the_shift_draws_what_gen_demos_perturbed_resets_always_drew() -> None:
    """One draw per movable object, x then y, from default_rng(seed): the stream the recorded
    demonstrations' perturbed variants were made with, so they still replay as recorded."""
    rng = np.random.default_rng(5)
    one_by_one = np.array([rng.uniform(-0.02, 0.02, size=2) for _ in range(4)])
    np.testing.assert_array_equal(xy_shifts_m(0.02, 5, 4), one_by_one)


def test_a_stacked_object_moves_with_its_support_and_one_on_a_fixture_stays() -> None:
    """LIBERO-Spatial's scenes stack bowls on a cookie box or a ramekin and put them in a drawer or on a
    stove; LIBERO-Object's stand on the floor (each takes its own draw, as it always did)."""
    owner: dict[str, str | None] = {"main_table_box_region": None, "main_table_plate_region": "main_table",  # a table zone: no owner body
             "wooden_cabinet_1_top_region": "wooden_cabinet_1", "flat_stove_1_cook_region": "flat_stove_1",
             "floor_bin_region": "floor"}  # fmt: skip
    category = {"main_table": "table", "wooden_cabinet_1": "wooden_cabinet", "flat_stove_1": "flat_stove",
                "floor": "floor"}  # fmt: skip
    movable = ["bowl_1", "bowl_2", "cookies_1", "plate_1", "bowl_3", "cup_1"]
    init = [["on", "bowl_1", "cookies_1"], ["in", "bowl_2", "wooden_cabinet_1_top_region"],
            ["on", "cookies_1", "main_table_box_region"], ["on", "plate_1", "main_table_plate_region"],
            ["on", "bowl_3", "flat_stove_1_cook_region"], ["open", "wooden_cabinet_1_top_region"]]  # fmt: skip
    assert shift_sources(movable, init, owner, category) == [2, None, 2, 3, None, 5]  # cup_1: no :init entry
    chain = [["on", "a", "b"], ["on", "b", "c"], ["on", "c", "floor_bin_region"]]
    assert shift_sources(["a", "b", "c"], chain, owner, category) == [2, 2, 2]
    loop = [["on", "a", "b"], ["on", "b", "a"]]  # malformed: no endless recursion, own draws
    assert shift_sources(["a", "b"], loop, owner, category) == [0, 1]
    on_floor = [["on", n, "floor_bin_region"] for n in movable]
    assert shift_sources(movable, on_floor, owner, category) == list(range(len(movable)))


class _Env:
    """Records how it was reset."""

    def __init__(self) -> None:
        self.resets: list[tuple[int, float, int]] = []
        self.instruction = "put the soup in the basket"
        self.task = SimpleNamespace(name="soup")

    def reset(self, init_state: int, perturb_xy_m: float = 0.0, seed: int = 0):
        self.resets.append((init_state, perturb_xy_m, seed))


def _pair(methods: list[str], envs: list[_Env], task: int, init_state: int, shift_m: float, seed: int) -> None:
    """Reset every method's env for one pair (no control step: max_steps 0)."""
    pol = SimpleNamespace(decoders={m: FakeDecoder() for m in methods}, timed={m: None for m in methods},
                          online=frozenset(), shadow=None)
    run_pair(0, task, init_state, methods, envs, pol, SimpleNamespace(append=lambda rec: None),
             SimpleNamespace(update=lambda n: None), shift_m, seed)


def test_every_method_of_a_pair_starts_from_the_same_shifted_scene() -> None:
    methods = ["ar", "drafter", "heisd"]
    envs = [_Env() for _ in methods]
    _pair(methods, envs, 2, 40, 0.02, 7)
    _pair(methods[:1], envs[:1], 2, 41, 0.02, 7)  # another pair in between, on one of the envs
    _pair(methods[::-1], envs, 2, 40, 0.02, 7)  # the same pair again, the methods in another order
    expected = (40, 0.02, scene_shift_seed(7, 2, 40))
    assert [e.resets[0] for e in envs] == [expected] * 3
    assert [e.resets[-1] for e in envs] == [expected] * 3
    assert envs[0].resets[1] == (41, 0.02, scene_shift_seed(7, 2, 41))
    plain = _Env()
    _pair(["ar"], [plain], 2, 40, 0.0, 7)
    assert plain.resets[0][:2] == (40, 0.0)  # D = 0: the reset LIBERO's init state always had


def test_config_and_flags() -> None:
    for bad in (-0.001, 0.021, math.nan, math.inf):
        with pytest.raises(ConfigError, match="scene-shift-m"):
            EvalLiberoConfig(scene_shift_m=bad)
    with pytest.raises(ConfigError, match="scene-seed"):
        EvalLiberoConfig(scene_seed=-1)
    assert EvalLiberoConfig(scene_shift_m=0.02).scene_shift_m == 0.02
    assert (EvalLiberoConfig().scene_shift_m, EvalLiberoConfig().scene_seed) == (0.0, 0)
    args = eval_libero.build_parser().parse_args(["--scene-shift-m", "0.02", "--scene-seed", "7"])
    cfg = eval_libero.config_from_args(args)
    assert (cfg.scene_shift_m, cfg.scene_seed) == (0.02, 7)


def _episode(method: str) -> dict:
    step = {"t": 0, "mode": "ar", "skipped": False, "forwards": 7, "tpf": [1] * 7, "ms": {"total": 40.0},
            "cpu_ms": 36.0, "sim_ms": 150.0, "F": 0.0, "score": 0.0, "ee": [0.0, 0.0, 0.2], "tokens": [1] * 7}
    return {"kind": "episode", "task": 0, "init_state": 40, "method": method, "instruction": "task 0",
            "success": False, "length": 1, "wall_s": 1.0, "steps": [step]}


def _report_from(tmp_path: Path, key: dict) -> tuple[dict, str]:
    log = ResultLog(tmp_path / "run.jsonl", key)
    for m in ("ar", "heisd"):
        log.append(_episode(m))
    out = tmp_path / "report.json"
    assert eval_libero.main(["--report-from", str(log.path), "--tasks", "0", "--init-states", "40",
                             "--methods", "ar,heisd", "--out", str(out)]) == 0
    return json.loads(out.read_text())["_meta"], out.with_suffix(".md").read_text()


KEY = {"suite": "libero_object", "max_steps": 1, "camera_size_px": 64, "dtype": "float32", "seed": 0}


def test_the_report_names_the_scene_set_of_its_log(tmp_path: Path) -> None:
    meta, md = _report_from(tmp_path, {**KEY, "scene_shift_m": 0.02, "scene_seed": 7})
    assert (meta["scene_shift_m"], meta["scene_seed"]) == (0.02, 7)
    assert "Scenes: shift D = 0.02 m" in md and "scene seed S = 7." in md


def test_a_log_from_before_sealed_scenes_reads_as_unshifted(tmp_path: Path) -> None:
    meta, md = _report_from(tmp_path, KEY)
    assert (meta["scene_shift_m"], meta["scene_seed"]) == (0.0, 0)
    assert "Scenes: shift D = 0 m" in md
