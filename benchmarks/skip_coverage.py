"""Verify-skip coverage on a built database: raw vs mean-centred feature cosine (DESIGN §6 offline rule).

For sampled steps of each task, the Top-5 neighbours by observation similarity from other episodes
are paired with the step (as `heisd calibrate` does, but with teacher-forced `feat` on both sides);
for each similarity measure it prints the 95 %-pass threshold and the share of pairs at or above it.

    .venv/bin/python benchmarks/skip_coverage.py --db artifacts/mini_db [--per-task 300]
"""

from __future__ import annotations

import argparse

import numpy as np

from heisd_ros.pipeline.calibration import passes_sequence_rule
from heisd_ros.core.acceptance import SequenceRelaxedRule
from heisd_ros.core.config import StoreConfig
from heisd_ros.store.factory import make_store


def coverage(sim: np.ndarray, ok: np.ndarray, target: float = 0.95) -> tuple[float | None, float]:
    """(threshold, share of pairs at or above it) for the largest top-similarity set passing >= target."""
    order = np.argsort(-sim)
    cum = np.cumsum(ok[order]) / np.arange(1, len(order) + 1)
    good = np.where(cum >= target)[0]
    if not len(good):
        return None, 0.0
    k = int(good.max()) + 1
    return float(sim[order][k - 1]), k / len(sim)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="artifacts/mini_db")
    ap.add_argument("--per-task", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    store = make_store(StoreConfig(backend="edge", path=args.db, collection="heisd_demos"))
    points = list(store.scroll())
    store.close()
    rng, rule = np.random.default_rng(args.seed), SequenceRelaxedRule()
    mean_feat = np.stack([p.feat for p in points]).mean(0)
    by_task: dict[str, list] = {}
    for p in points:
        by_task.setdefault(p.task, []).append(p)
    raw, centred, ok = [], [], []
    for members in by_task.values():
        obs = np.stack([m.obs for m in members])
        obs /= np.linalg.norm(obs, axis=1, keepdims=True)
        feat = np.stack([m.feat for m in members])
        f_raw = feat / np.linalg.norm(feat, axis=1, keepdims=True)
        f_cen = (feat - mean_feat) / np.linalg.norm(feat - mean_feat, axis=1, keepdims=True)
        episode = np.array([m.episode for m in members])
        for i in rng.choice(len(members), min(args.per_task, len(members)), replace=False):
            score = obs @ obs[i]
            score[episode == episode[i]] = -np.inf
            for j in np.argsort(-score)[:5]:
                raw.append(f_raw[i] @ f_raw[j])
                centred.append(f_cen[i] @ f_cen[j])
                ok.append(passes_sequence_rule(members[j].action_tokens, members[i].action_tokens, rule))
    ok_arr = np.array(ok)
    print(f"{len(ok)} pairs, sequence-relaxed pass rate {ok_arr.mean():.3f}")
    for name, sim in (("raw", np.array(raw)), ("centred", np.array(centred))):
        thr, share = coverage(sim, ok_arr)
        print(f"{name:8s} cosine: 95 %-pass threshold {thr if thr is None else round(thr, 4)}, pairs qualifying {share:.3f}")


if __name__ == "__main__":
    main()
