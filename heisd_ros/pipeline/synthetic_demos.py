"""Synthetic demonstrations for tests and `heisd bench --model tiny` (no simulator needed).

Each episode moves the end effector fast along a straight line towards a goal, then slowly along
an arc (the coarse/fine structure the fused metric separates). Images are rendered from the
state: a task-coloured background, a blob whose position/size follow the end effector
(agentview), and a wrist view whose brightness pattern follows height. Seeded and deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TASKS = ("pick up the red bowl", "push the blue block to the left")


@dataclass
class SyntheticStep:
    images: dict[str, np.ndarray]
    ee_pos: np.ndarray
    instruction: str
    episode: int
    step: int


def trajectory(rng: np.random.Generator, n_steps: int, task_index: int = 0) -> np.ndarray:
    """[n_steps, 3] metres: straight fast transport (70%), then a slow 90-degree arc (fine approach).

    Start and goal are fixed per task up to a few millimetres of noise, as in a demonstration set
    where the same task is shown from slightly different initial states.
    """
    n_line = int(n_steps * 0.7)
    task_rng = np.random.default_rng(1000 + task_index)
    start = task_rng.uniform([-0.2, -0.2, 0.25], [0.2, 0.2, 0.35]) + rng.normal(0, 0.004, 3)
    goal = task_rng.uniform([-0.1, -0.1, 0.08], [0.1, 0.1, 0.12]) + rng.normal(0, 0.002, 3)
    line = start + np.linspace(0, 1, n_line)[:, None] * (goal - start)
    radius = 0.045 + rng.normal(0, 0.001)
    phase = np.linspace(0, np.pi / 2, n_steps - n_line + 1)[1:]
    arc = goal + radius * np.stack([np.sin(phase), 1 - np.cos(phase), -0.2 * phase], axis=1)
    return np.concatenate([line, arc])


def render(ee_pos: np.ndarray, task_index: int, size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    yy, xx = np.mgrid[0:size, 0:size] / size
    colour = np.array([[200, 60, 60], [60, 60, 200], [60, 160, 60]][task_index % 3], dtype=np.float64)
    cx, cy = 0.5 + 1.8 * ee_pos[0], 0.5 + 1.8 * ee_pos[1]
    blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (0.02 + 0.1 * ee_pos[2]))
    agent = 40 + colour * 0.3 + blob[..., None] * colour * 0.7
    wrist = 128 + 100 * np.sin(2 * np.pi * (xx + yy) * (1 + 10 * ee_pos[2]))[..., None] * np.array([1.0, 0.8, 0.6])
    out = {}
    for name, img in (("agentview", agent), ("wrist", wrist)):
        noisy = img + rng.normal(0, 2.0, img.shape)
        out[name] = np.clip(noisy, 0, 255).astype(np.uint8)
    return out


def episodes(seed: int, n_episodes: int, n_steps: int = 40, image_size: int = 64, tasks=TASKS):
    """Yield SyntheticStep for `n_episodes` per task, deterministically from `seed`."""
    rng = np.random.default_rng(seed)
    for t, instruction in enumerate(tasks):
        for e in range(n_episodes):
            traj = trajectory(rng, n_steps, t)
            for s, p in enumerate(traj):  # episode ids are unique across tasks
                yield SyntheticStep(render(p, t, image_size, rng), p, instruction, t * n_episodes + e, s)


def random_observation(seed: int, instruction: str = TASKS[0], views=("agentview", "wrist"), size: int = 64):
    """Noise images + a random end-effector position (tests of decoding paths, not of behaviour)."""
    from heisd_ros.core.types import Observation

    rng = np.random.default_rng(seed)
    images = {v: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for v in views}
    return Observation(images, instruction, rng.uniform(-0.3, 0.3, 3))
