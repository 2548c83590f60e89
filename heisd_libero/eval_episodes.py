"""The closed loop of `heisd-libero eval-libero`: every method's episode on one (task, init state), the
methods taking turns at every control step, and the log record of each step and episode."""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import numpy as np

from heisd_ros.core.gripper import finger_gap
from heisd_ros.core.types import Observation
from heisd_libero.sim.libero_env import scene_shift_seed
from heisd_libero.eval_policies import Policies, TimedStore


def input_digest(obs: Observation) -> str:
    """Digest of everything a decoder reads at a step: every view's pixels, the end-effector
    position, the finger gap and the instruction. Two steps with one digest have the same input, so
    a strict step must then decode the same tokens as `ar` did on it."""
    h = hashlib.sha256()
    for view in sorted(obs.images):
        image = np.ascontiguousarray(obs.images[view])
        h.update(f"{view}:{image.shape}:{image.dtype}".encode())
        h.update(image.tobytes())
    h.update(np.asarray(obs.ee_pos, dtype=np.float64).tobytes())
    h.update(np.float64(np.nan if obs.gripper_gap is None else obs.gripper_gap).tobytes())
    h.update(obs.instruction.encode())
    return h.hexdigest()[:16]


def step_record(t: int, st, cpu_ms: float, sim_ms: float, ee_pos: np.ndarray, digest: str = "",
                shadow: tuple[int, ...] | None = None) -> dict[str, Any]:
    """One control step of the log: the decoder's StepStats, its thread CPU time beside its wall
    time, the simulator's time, the input digest (strict steps and the first) and, on a shadowed
    step (every lossy one and the chosen strict ones with `--shadow-ar`), the tokens greedy `ar`
    decodes on the same observation. Times are kept to
    0.1 ms: a step takes 10-100 ms, the rounding error averages out over a run's thousands of
    steps, and the committed log of a full run stays a few MB (three decimals: 6.5 against 4.1 MB
    gzipped for 490 episodes)."""
    rec = {
        "t": t, "mode": st.mode, "skipped": st.skipped, "forwards": st.llm_forwards, "tpf": list(st.tokens_per_forward),
        "ms": {k: round(v, 1) for k, v in st.latency_ms.items()}, "fwd_ms": [round(x, 1) for x in st.forward_ms],
        "cpu_ms": round(cpu_ms, 1),
        "sim_ms": round(sim_ms, 1), "F": round(st.fused_metric, 4), "score": round(st.retrieval_score, 4),
        "ee": [round(float(x), 4) for x in ee_pos], "tokens": [int(x) for x in st.tokens],
        "strict": bool(st.strict),
    }
    if st.strict or t == 0:  # what the evidence compares with ar's steps (a lossy step's input is its own)
        rec["digest"] = digest
    if shadow is not None:
        rec["shadow"] = [int(x) for x in shadow]
    if st.fallback:
        rec["fallback"] = st.fallback
    if st.gripper_held:
        rec["gripper_held"] = True
    if st.skip_check:
        rec["skip_check"] = st.skip_check
        rec["skip_sim"] = round(st.skip_similarity, 5)
        for key, value in (("skip_spread", st.skip_spread_bins), ("skip_from_verified", st.skip_from_verified_bins)):
            if math.isfinite(value):
                rec[key] = value
    return rec


def shadows_step(strict: bool, strict_index: int, strict_every: int) -> bool:
    """Whether greedy ar also decodes a step: every lossy step (its deviation), and of the strict
    steps the 1st, (N+1)-th, ... of the episode for `strict_every` N (0: none), `strict_index`
    counting the strict steps before this one (the strict-step agreement along the method's path)."""
    if not strict:
        return True
    return strict_every > 0 and strict_index % strict_every == 0


class MethodEpisode:
    """One method's episode on its own env instance.

    `online`: the method adapts its verify-skip thresholds across episodes (Alg. 1's online stage,
    in the run's task order). Otherwise the episode starts from the configured operating point, so
    it does not depend on the episodes before it. `shadow`: an `ar` decoder run (outside the timed
    call) on every lossy step, for the per-step deviation from greedy decoding, and on the strict
    steps `shadow_strict_every` picks (`shadows_step`), for their agreement with it. `scene`: (shift bound
    in metres, reset seed) of the pair's sealed scene, the same for every method of the pair."""

    def __init__(self, method: str, env, decoder, store: TimedStore | None, init_state: int,
                 online: bool = False, shadow=None, shadow_strict_every: int = 0,
                 scene: tuple[float, int] = (0.0, 0)) -> None:
        self.method, self.env, self.decoder, self.store = method, env, decoder, store
        self.online, self.shadow, self.shadow_strict_every = online, shadow, shadow_strict_every
        self.strict_steps = 0
        self.steps: list[dict[str, Any]] = []
        self.success = False
        self.done = False
        if not online:
            decoder.restore_operating_point()
        self.skip_start = (decoder.skip.min_similarity, decoder.skip.max_distance_m)
        self.obs = env.reset(init_state, perturb_xy_m=scene[0], seed=scene[1])
        decoder.reset(env.instruction)
        if store is not None:
            store.search_ms = []
        self.t0 = time.perf_counter()

    def act(self, t: int) -> None:
        obs = self.obs
        seen = Observation(obs.images, self.env.instruction, obs.ee_pos, gripper_gap=finger_gap(obs.gripper_qpos))
        c0 = time.thread_time()
        action, st = self.decoder.step(seen)
        cpu_ms = (time.thread_time() - c0) * 1e3
        shadow = None
        if self.shadow is not None and shadows_step(st.strict, self.strict_steps, self.shadow_strict_every):
            shadow = self.shadow.step(seen)[1].tokens
        self.strict_steps += int(st.strict)
        s0 = time.perf_counter()
        self.obs, self.success = self.env.step(action)
        self.steps.append(step_record(t, st, cpu_ms, (time.perf_counter() - s0) * 1e3, obs.ee_pos,
                                      input_digest(seen), shadow))
        self.done = self.success

    def record(self, task: int, init_state: int) -> dict[str, Any]:
        rec = {
            "kind": "episode", "task": task, "init_state": init_state, "method": self.method,
            "instruction": self.env.instruction, "task_name": str(self.env.task.name), "success": self.success,
            "length": len(self.steps), "wall_s": round(time.perf_counter() - self.t0, 2),
            "online": self.online,
            "verify_skip_start": {"min_similarity": self.skip_start[0], "max_distance_m": self.skip_start[1]},
            "steps": self.steps,
        }
        if self.store is not None:
            rec["search_ms"] = [round(x, 4) for x in self.store.search_ms]
            rec["search_k"] = self.store.last_k
            self.store.search_ms = []
        return rec


def run_pair(max_steps: int, task: int, init_state: int, methods: list[str], envs: list, pol: Policies,
             log, bar, scene_shift_m: float = 0.0, scene_seed: int = 0, shadow_strict_every: int = 0) -> None:
    """All `methods` on one (task, init state), taking turns per control step; logs each episode as it ends.

    Every env starts from the pair's sealed scene: its movable objects shifted by up to
    `scene_shift_m` in x and y, drawn from (scene_seed, task, init_state) alone, so every method of
    the pair sees the same start whatever ran before (0 m: the init state as LIBERO ships it).
    `shadow_strict_every`: which strict steps greedy ar shadows (`shadows_step`; never ar's own)."""
    scene = (scene_shift_m, scene_shift_seed(scene_seed, task, init_state))
    eps = [MethodEpisode(m, env, pol.decoders[m], pol.timed[m], init_state, online=m in pol.online,
                         shadow=pol.shadow, scene=scene, shadow_strict_every=0 if m == "ar" else shadow_strict_every)
           for m, env in zip(methods, envs)]

    def finish(e: MethodEpisode) -> None:
        if e.online:
            e.decoder.episode_feedback(e.success)
        log.append(e.record(task, init_state))
        bar.update(1)

    for t in range(max_steps):
        active = [e for e in eps if not e.done]
        if not active:
            break
        for e in active:
            e.act(t)
            if e.done:
                finish(e)
        if t % 10 == 0:
            bar.set_postfix_str(f"task {task} init {init_state} step {t}/{max_steps} "
                                f"ok {sum(e.success for e in eps)}/{len(eps)}")
    for e in eps:
        if not e.done:
            finish(e)
