"""Does a token of the mini VLA read the image or the tokens before it? (NOTES entry 30)

Teacher-forced on held-out demo steps, each step's action tokens 0..k-1 are replaced by those of
a random other step of the same task (a "donor") whose token k differs from the step's own. If
token k's prediction then follows the donor, the model reads it off the prefix; if it keeps the
step's own value, it reads the image. The gripper (k = 6) is the case that matters: in the demos
a closed gripper goes with a lift and an open one with a descent, so the six tokens before it
predict it perfectly, and in closed loop one wrong translation token would flip it.

    .venv/bin/python benchmarks/prefix_shortcut.py --model models/mini_libero/vla \
        --demos artifacts/demos_db/libero_object --cache-dir artifacts/mini_libero_features \
        --json benchmarks/prefix_shortcut_shipped.json

Held-out episodes: the model's own split (train-vla's `split_episodes` with its seed and
`val_fraction`). "Follows the image" counts exact matches of the step's own token, "follows the
prefix" exact matches of the donor's token; the rest is neither.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

DIMS = ("X", "Y", "Z", "rX", "rY", "rZ", "G")


def main() -> None:
    from heisd_ros.pipeline.features import FeatureCache, episode_examples
    from heisd_ros.pipeline.episodes import scan_hdf5, split_episodes
    from heisd_ros.models.loader import load_vla
    from heisd_ros.pipeline.training import action_logits, teacher_forced

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--demos", required=True)
    ap.add_argument("--cache-dir", required=True, help="train-vla's feature cache (frozen backbone)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    vla = load_vla(args.model, dtype="float32").eval()
    train_cfg = json.loads((Path(args.model) / "train_log.json").read_text())["config"]
    refs = scan_hdf5(args.demos, train_cfg.get("tasks"))
    _, held = split_episodes(refs, train_cfg["val_fraction"], train_cfg["seed"])
    cache = FeatureCache(args.cache_dir, vla)
    by_task: dict[str, list] = {}
    for r in held:
        for ex in episode_examples(vla, vla.stats(), r, cache):
            by_task.setdefault(ex.instruction, []).append(ex)
    first = vla.action_tokenizer.first_token_id
    rng = np.random.default_rng(args.seed)

    def predict(batch, inputs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            hidden, _, p = teacher_forced(vla, batch, inputs)
            return action_logits(vla, hidden[:, p - 1 : p + 6]).argmax(-1).numpy() + first

    counts = {d: {"n": 0, "image": 0, "prefix": 0} for d in DIMS[1:]}
    clean_ok = clean_n = 0
    for group in by_task.values():
        tokens = np.stack([ex.tokens for ex in group])
        for s in range(0, len(group), 64):
            batch, own = group[s : s + 64], tokens[s : s + 64]
            clean = predict(batch, own)
            clean_ok += int((clean == own).sum())
            clean_n += own.size
            for k in range(1, 7):
                # a donor per step whose token k differs from the step's own (None if none exists)
                donors = np.array([rng.choice(np.flatnonzero(tokens[:, k] != t)) if np.any(tokens[:, k] != t) else -1
                                   for t in own[:, k]])
                keep = donors >= 0
                if not keep.any():
                    continue
                inputs = own.copy()
                inputs[keep, :k] = tokens[donors[keep], :k]
                pred = predict(batch, inputs)[keep, k]
                c = counts[DIMS[k]]
                c["n"] += int(keep.sum())
                c["image"] += int((pred == own[keep, k]).sum())
                c["prefix"] += int((pred == tokens[donors[keep], k]).sum())
    result = {
        "model": args.model, "demos": args.demos, "held_out_steps": sum(len(g) for g in by_task.values()),
        "teacher_forced_token_accuracy": clean_ok / max(clean_n, 1),
        "donor_prefix": {d: {"steps": c["n"], "follows_image": c["image"] / max(c["n"], 1),
                             "follows_prefix": c["prefix"] / max(c["n"], 1)} for d, c in counts.items()},
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
