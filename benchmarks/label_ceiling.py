"""How predictable are the expert's action tokens from the simulator's full state? (NOTES entry 24)

The mini VLA stops at held-out token accuracy 0.79 whatever it sees (entries 15, 18-20). This
measures the same figure for a nearest-neighbour predictor that sees what no camera policy can:
the simulator's full state vector (`states`: every body's pose and velocity) of the demo step,
optionally with the previous action. If even that predictor stays near 0.79, the ceiling is in
the labels (the expert's exact translation bins are not a function of the state); if it goes far
above, the images hide what the expert acts on.

    .venv/bin/python benchmarks/label_ceiling.py --model artifacts/mini_vla \
        --demos artifacts/demos_db/libero_object --json benchmarks/label_ceiling.json

The held-out episodes are the ones the model held out in training (its train_log.json), the
action tokens are the model's own (its normalisation statistics and 256 bins).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import h5py
import numpy as np

DIMS = ("X", "Y", "Z", "rX", "rY", "rZ", "G")


def load(demos: Path, held_out: set[str]):
    """(features dict, tokens) for the train and held-out split: one row per demo step."""
    split: dict[str, dict[str, list]] = {s: {"state": [], "prev": [], "task": [], "actions": []} for s in ("train", "test")}
    for i, f in enumerate(sorted(demos.glob("*.hdf5"))):
        with h5py.File(f) as h:
            for name in h["data"]:
                ep = h["data"][name]
                actions = ep["actions"][()]
                prev = np.vstack([np.zeros((1, 7)), actions[:-1]])
                s = split["test" if f"{f.name}:{name}" in held_out else "train"]
                s["state"].append(ep["states"][()])
                s["prev"].append(prev)
                s["task"].append(np.full(len(actions), i))
                s["actions"].append(actions)
    return {k: {n: np.concatenate(v) for n, v in d.items()} for k, d in split.items()}


def nearest(train_x: np.ndarray, test_x: np.ndarray, train_task: np.ndarray, test_task: np.ndarray) -> np.ndarray:
    """Index of the nearest train row of the same task for every test row (Euclidean)."""
    out = np.empty(len(test_x), np.int64)
    for t in np.unique(test_task):
        tr, te = np.flatnonzero(train_task == t), np.flatnonzero(test_task == t)
        a, b = train_x[tr], test_x[te]
        d = (b**2).sum(1)[:, None] - 2 * b @ a.T + (a**2).sum(1)[None, :]
        out[te] = tr[np.argmin(d, axis=1)]
    return out


def score(pred: np.ndarray, true: np.ndarray) -> dict:
    eq = pred == true
    return {"token_accuracy": float(eq.mean()),
            "per_dim_accuracy": {d: round(float(eq[:, i].mean()), 3) for i, d in enumerate(DIMS)},
            "mean_abs_bin_error_xyz": float(np.abs(pred[:, :3] - true[:, :3]).mean())}


def run(model: str, demos: str) -> dict:
    from heisd_ros.models.loader import load_vla

    vla = load_vla(model)
    stats, tok = vla.stats(), vla.action_tokenizer
    log = json.loads((Path(model) / "train_log.json").read_text())
    held_out = set(log["episodes"]["held_out_sources"])
    data = load(Path(demos), held_out)
    tokens = {k: tok.encode(stats.normalise(v["actions"])) for k, v in data.items()}
    mu, sd = data["train"]["state"].mean(0), data["train"]["state"].std(0)
    live = sd > 1e-3  # drop the near-constant entries (static bodies), whose scaled noise would dominate
    mu, sd = mu[live], sd[live]
    res_live = int(live.sum())
    res: dict = {"model": model, "demos": demos, "train_steps": len(tokens["train"]),
                 "held_out_steps": len(tokens["test"]),
                 "model_held_out": log["final"]["held_out"]["token_accuracy"],
                 "model_held_out_per_dim": log["final"]["held_out"].get("per_dim_accuracy"),
                 "state_entries_used": res_live}
    variants = {
        "full_state": lambda d: (d["state"][:, live] - mu) / sd,
        "full_state+prev_action": lambda d: np.hstack([(d["state"][:, live] - mu) / sd, 10.0 * d["prev"]]),
    }
    for name, feats in variants.items():
        idx = nearest(feats(data["train"]), feats(data["test"]), data["train"]["task"], data["test"]["task"])
        res[name] = score(tokens["train"][idx], tokens["test"])
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="artifacts/mini_vla")
    p.add_argument("--demos", default="artifacts/demos_db/libero_object")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    res = run(args.model, args.demos)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
