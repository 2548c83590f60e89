"""Which steps of an eval-libero episode greedy ar shadows (heisd_libero/eval_episodes.py), on a scripted
decoder and env (no simulator, no model): every lossy step, and the strict steps
`--shadow-strict-every` picks, outside the timed call; never ar's own steps."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
from fake_decoder import FakeDecoder

from heisd_ros.core.types import StepStats
from heisd_libero.eval_episodes import MethodEpisode, run_pair, shadows_step

SHADOW_TOKENS = (1200, 1201, 1202, 1203, 1204, 1205, 1281)


class ScriptedEnv:
    """An env whose observation never changes and whose task is never solved."""

    instruction = "pick up the soup"
    task = SimpleNamespace(name="soup")

    def _obs(self):
        return SimpleNamespace(images={v: np.zeros((4, 4, 3), np.uint8) for v in ("agentview", "wrist")}, ee_pos=np.zeros(3),
                               gripper_qpos=np.array([0.02, -0.02]))

    def reset(self, init_state: int, **scene):
        return self._obs()

    def step(self, action):
        return self._obs(), False


def scripted(script: list[bool]) -> FakeDecoder:
    """The fake decoder whose steps are strict (drafter) or lossy (skip) as `script` says, cycled."""
    modes = [("drafter" if strict else "skip") for strict in script]
    return FakeDecoder(modes=modes[-1:] + modes[:-1])  # its step n takes modes[n % len]


class BusyShadow:
    """Greedy ar's stand-in: burns `cpu_ms` of thread time per call, so a shadow inside the timed
    call would show in the step's CPU time."""

    def __init__(self, cpu_ms: float = 0.0) -> None:
        self.calls, self.cpu_ms = 0, cpu_ms

    def step(self, obs):
        self.calls += 1
        end = time.thread_time() + self.cpu_ms / 1e3
        while time.thread_time() < end:
            pass
        return np.zeros(7), StepStats(mode="ar", tokens=SHADOW_TOKENS, strict=True)


def _shadowed(every: int, script: list[bool], steps: int, cpu_ms: float = 0.0) -> tuple[list[dict], BusyShadow]:
    shadow = BusyShadow(cpu_ms)
    episode = MethodEpisode("heisd", ScriptedEnv(), scripted(script), None, 40, shadow=shadow,
                            shadow_strict_every=every)
    for t in range(steps):
        episode.act(t)
    return episode.steps, shadow


def test_which_steps_are_shadowed() -> None:
    assert shadows_step(False, 7, 0) and shadows_step(False, 1, 3)  # every lossy step
    assert not shadows_step(True, 0, 0)  # 0: no strict step
    assert all(shadows_step(True, k, 1) for k in range(5))
    assert [k for k in range(8) if shadows_step(True, k, 3)] == [0, 3, 6]  # the 1st, 4th, 7th strict step


@pytest.mark.parametrize("every, shadowed", [(0, [1]), (1, [0, 1, 2, 3, 4, 5]), (2, [0, 1, 3, 5])])
def test_an_episode_shadows_its_lossy_steps_and_every_nth_strict_step(every: int, shadowed: list[int]) -> None:
    # strict, lossy, then four strict steps: strict indices 0, 1, 2, 3, 4 at t = 0, 2, 3, 4, 5
    steps, shadow = _shadowed(every, [True, False, True, True, True, True], 6)
    assert [s["t"] for s in steps if "shadow" in s] == shadowed and shadow.calls == len(shadowed)
    assert all(s["shadow"] == list(SHADOW_TOKENS) for s in steps if "shadow" in s)
    assert all(s["strict"] == (s["t"] != 1) for s in steps) and all("digest" in s for s in steps if s["strict"])


def test_the_shadow_runs_outside_the_timed_call() -> None:
    steps, shadow = _shadowed(1, [True], 3, cpu_ms=30.0)
    assert shadow.calls == 3 and all(s["cpu_ms"] < 15.0 for s in steps)


def test_run_pair_never_shadows_ars_own_strict_steps() -> None:
    log = []
    pol = SimpleNamespace(decoders={"ar": scripted([True]), "drafter": scripted([True])},
                          timed={"ar": None, "drafter": None}, online=frozenset(), shadow=BusyShadow())
    bar = SimpleNamespace(update=lambda n: None, set_postfix_str=lambda text: None)
    log_sink = SimpleNamespace(append=log.append)
    run_pair(3, 0, 40, ["ar", "drafter"], [ScriptedEnv(), ScriptedEnv()], pol, log_sink, bar, shadow_strict_every=1)
    by_method = {e["method"]: e["steps"] for e in log}
    assert len(by_method["ar"]) == len(by_method["drafter"]) == 3
    assert not any("shadow" in s for s in by_method["ar"]) and all("shadow" in s for s in by_method["drafter"])
    assert pol.shadow.calls == 3
