"""Closed-loop MLP policies on the robot's own state (NOTES 43): can a *learned, smooth* map do what
the nearest-neighbour lookup of NOTES 38 does?

Per task, a two-layer MLP classifies each of the 7 action dimensions into the VLA's 256 bins
(q01/q99 of `--stats`, the gripper by sign) from the same features as `nn_closed_loop.py`
(standardised), optionally with sin/cos octaves of the position (`--octaves`, as
`train-vla --proprio-fourier`). Trained on every step of the task's demos, then run closed loop in
LIBERO from the evaluation init states, no images:

    MUJOCO_GL=egl .venv/bin/python benchmarks/mlp_closed_loop.py --features robot --octaves 0 \
        --json benchmarks/mlp_closed_loop_robot.json

~3 s of training per task and ~2 s per episode on one core.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nn_closed_loop import closed_loop, demo_table  # noqa: E402

from heisd_ros.tools.args import parse_range  # noqa: E402

BINS = 256


def bins_codec(stats_path: str):
    """(actions [N, 7] -> bins [N, 7], bins [7] -> action [7]) with the VLA's q01/q99 and 256 bins."""
    stats = json.loads(Path(stats_path).read_text())["default"]["action"]
    q01, q99 = np.array(stats["q01"]), np.array(stats["q99"])
    edges = np.linspace(-1, 1, BINS + 1)
    centres = (edges[:-1] + edges[1:]) / 2

    def encode(a: np.ndarray) -> np.ndarray:
        n = np.clip(2 * (a - q01) / np.maximum(q99 - q01, 1e-8) - 1, -1, 1)
        n[:, 6] = np.sign(a[:, 6])
        return np.clip(np.digitize(n, edges) - 1, 0, BINS - 1)

    def decode(b: np.ndarray) -> np.ndarray:
        n = centres[b]
        a = 0.5 * (n + 1) * (q99 - q01) + q01
        a[6] = 1.0 if n[6] > 0 else -1.0
        return a

    return encode, decode


def features(x: np.ndarray, mu: np.ndarray, sd: np.ndarray, octaves: int) -> np.ndarray:
    z = (x - mu) / sd
    parts = [z]
    for k in range(octaves):
        parts += [np.sin(2**k * np.pi * z[..., :3]), np.cos(2**k * np.pi * z[..., :3])]
    return np.concatenate(parts, -1).astype(np.float32)


def train(x: np.ndarray, y: np.ndarray, hidden: int, steps: int, seed: int) -> tuple[torch.nn.Module, float, list]:
    torch.manual_seed(seed)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], hidden), torch.nn.GELU(),
                              torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 7 * BINS))
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(X), (256,), generator=g)
        loss = torch.nn.functional.cross_entropy(net(X[idx]).view(-1, 7, BINS).permute(0, 2, 1), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (net(X).view(-1, 7, BINS).argmax(-1) == Y).float().mean(0)
    return net.eval(), float(loss), [round(float(a), 3) for a in acc]


def run(args) -> dict:
    torch.set_num_threads(1)
    encode, decode = bins_codec(args.stats)
    episodes, fits = [], {}
    for task in parse_range(args.tasks):
        x, a, feat = demo_table(Path(args.demos), task, args.features, 1.0)
        mu, sd = x.mean(0), x.std(0) + 1e-6
        net, loss, acc = train(features(x, mu, sd, args.octaves), encode(a), args.hidden, args.steps, args.seed)
        fits[task] = {"final_loss": round(loss, 4), "train_accuracy_per_dim": acc}

        def greedy(env, obs, dwell, net=net, feat=feat, mu=mu, sd=sd):
            with torch.no_grad():
                logits = net(torch.from_numpy(features(feat(env, obs, dwell)[None], mu, sd, args.octaves)))
            return decode(logits.view(7, BINS).argmax(-1).numpy())

        episodes += closed_loop(args.suite, task, args.init_states, args.max_steps, greedy)
    wins = sum(e["success"] for e in episodes)
    return {"command": " ".join(sys.argv), "demos": args.demos, "features": args.features, "octaves": args.octaves,
            "hidden": args.hidden, "train_steps": args.steps, "seed": args.seed, "max_steps": args.max_steps,
            "success": wins, "episodes_run": len(episodes), "success_rate": wins / max(len(episodes), 1),
            "fits": fits, "episodes": episodes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--demos", default="artifacts/demos_db/libero_object")
    p.add_argument("--stats", default="models/mini_libero/vla/dataset_statistics.json")
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--tasks", default="0-9")
    p.add_argument("--init-states", default="40-41")
    p.add_argument("--features", choices=("robot", "dwell"), default="robot")
    p.add_argument("--octaves", type=int, default=0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=280)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    res = run(args)
    print(f"MLP {args.features}, {args.octaves} octaves: {res['success']}/{res['episodes_run']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
