"""Where a retrieval step's time goes: the retrieval stage and a skipped step with the pool read
whole (the engine's path before `search_near`) against the two-phase search, and what the fused
prefill-verify forward pays for its tree.

Usage:
    python benchmarks/retrieval_stage.py --model models/mini_libero/vla --drafter models/mini_libero/drafter \\
        --db artifacts/eval_object/db --demos artifacts/eval_object/demos [--tasks 0-9] [--steps-per-task 40] [--pool 20] [--top-k 5] \\
        [--threads 1] [--json out.json]

1. Retrieval stage: for demonstration observations of every task (their own pixels through the
   model's vision; the first view, as the evaluation database pools), the Top-`pool` by similarity
   re-ranked to the `top_k` nearest hands, two ways, interleaved per query:
   `whole_pool` = `store.search(pool)` (payload and both features of every pooled hit) + re-rank;
   `two_phase` = `store.search_near` (ids, scores, positions of the pool; payload and features of
   the kept hits only). Both must return the same hits (checked).
2. Skipped step: two heisd decoders (tau 0, verify-skip accepting any similarity and distance, up to
   100 skips in a row) over the same consecutive demonstration steps, one reading the pool whole and
   one two-phase; the mean of their skipped steps, and the floor a skip cannot beat: vision + the
   Top-k query.
3. First forward: the prefill alone against the prefill fused with a retrieval tree of N nodes, and
   with N more chain tokens under the causal mask (what the extra positions cost, and the tree mask).
Wall times on one machine in one run; JSON with config, git revision and figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np
import torch

from heisd_ros.assembly import PolicyParts, assemble_decoders
from heisd_ros.core.config import DecoderConfig, FusedMetricConfig, RetrievalConfig, StoreConfig, VerifySkipConfig
from heisd_ros.core.drafter import load_drafter
from heisd_ros.core.engine import embed_views, prompt_patches
from heisd_ros.core.tree import sequence_tree
from heisd_ros.core.types import Observation
from heisd_ros.core.verifier import TargetSession
from heisd_ros.models.loader import load_policy_model
from heisd_ros.pipeline.episodes import load_episode, scan_hdf5
from heisd_ros.pipeline.figures import distribution
from heisd_ros.pipeline.outputs import git_revision, write_json
from heisd_ros.store.base import nearest_first
from heisd_ros.store.factory import make_store
from heisd_ros.tools.args import parse_range


class WholePool:
    """The store as the engine read it before `search_near`: the whole pool, then the re-rank."""

    def __init__(self, store) -> None:
        self.store = store

    def search_near(self, query, task, top_k, ee_pos, pool, timing_ms=None):
        t0 = time.perf_counter()
        hits = self.store.search(query, task, pool)
        t1 = time.perf_counter()
        kept = [hits[i] for i in nearest_first([h.ee_pos for h in hits], ee_pos)[:top_k]]
        if timing_ms is not None:
            timing_ms.update(query=(t1 - t0) * 1e3, rerank=(time.perf_counter() - t1) * 1e3, fetch=0.0)
        return kept

    def __getattr__(self, name):
        return getattr(self.store, name)


def observations(demos: str, tasks, per_task: int) -> list[Observation]:
    out = []
    for ref in scan_hdf5(demos, tasks):
        if sum(o.task == ref.task for o in out) >= per_task:
            continue
        ep = load_episode(ref)
        for t in range(min(ep.length, per_task)):
            out.append(Observation({v: ep.images[v][t] for v in ep.images}, ep.instruction, ep.ee_pos[t],
                                   task=ep.task, gripper_gap=ep.finger_gap(t)))
    return out


def retrieval_stage(vla, store, obs: list[Observation], pool: int, top_k: int) -> dict:
    whole, two = WholePool(store), store
    times: dict[str, list[float]] = {"whole_pool": [], "two_phase": [], "two_phase_query": [], "two_phase_fetch": []}
    for o in obs:
        with torch.inference_mode():
            query, _ = embed_views(vla, [o.images["agentview"]])
        for name, s in (("whole_pool", whole), ("two_phase", two)):
            timing: dict[str, float] = {}
            t0 = time.perf_counter()
            hits = s.search_near(query, o.task_key, top_k, o.ee_pos, pool, timing)
            times[name].append((time.perf_counter() - t0) * 1e3)
            if name == "two_phase":
                times["two_phase_query"].append(timing["query"])
                times["two_phase_fetch"].append(timing["fetch"])
                if [(h.episode, h.step) for h in hits] != [(h.episode, h.step) for h in ref_hits]:
                    raise SystemExit("retrieval_stage: the two searches returned different hits")
            else:
                ref_hits = hits
    return {k: distribution(v) for k, v in times.items()}


def skipped_steps(vla, prior, drafter, store, obs: list[Observation], cfg: DecoderConfig) -> dict:
    decoders = assemble_decoders(PolicyParts(vla, prior, drafter, store), {"whole_pool": cfg, "two_phase": cfg},
                                 stores={"whole_pool": WholePool(store)})
    steps: dict[str, list] = {k: [] for k in decoders}
    for o in obs:
        for name, dec in decoders.items():
            steps[name].append(dec.step(o)[1])
    out = {}
    for name, stats in steps.items():
        skips = [s for s in stats if s.skipped]
        out[name] = {"skipped_steps": len(skips), "of_steps": len(stats),
                     "skip_step_ms": distribution([s.latency_ms["total"] for s in skips]),
                     "vision_ms": distribution([s.latency_ms["vision"] for s in skips]),
                     "retrieval_ms": distribution([s.latency_ms["retrieval"] for s in skips]),
                     "query_ms": distribution([s.latency_ms["retrieval_query"] for s in skips])}
        floor = out[name]["vision_ms"]["mean"] + out[name]["query_ms"]["mean"]
        out[name]["floor_ms"] = floor
        out[name]["skip_over_floor"] = out[name]["skip_step_ms"]["mean"] / floor if floor else None
    return out


def first_forward(vla, obs: list[Observation], nodes: tuple[int, ...], repeats: int) -> dict:
    head = vla.action_head_weight()
    vocab = vla.action_tokenizer.vocab_size
    rng = np.random.default_rng(0)
    out: dict[str, list[float]] = {"prefill": []}
    for n in nodes:
        out[f"tree_{n}"], out[f"chain_{n}"] = [], []
    for o in obs[:repeats]:
        with torch.inference_mode():
            _, patches = embed_views(vla, [o.images["agentview"]])
            prompt = vla.prompt_embeds(o.instruction, vla.projector(prompt_patches(vla, patches)), state=o.ee_pos,
                                       gripper_gap=o.gripper_gap)[0]
            sessions = {"prefill": (prompt, None)}
            for n in nodes:
                drafts = [tuple(int(x) for x in vocab - rng.integers(1, 256, 7)) for _ in range(16)]
                tree = sequence_tree(drafts, max_nodes=n)
                extra = TargetSession(vla.language_model, head).token_embeds(list(tree.tokens))
                sessions[f"tree_{n}"] = (prompt, tree)
                sessions[f"chain_{n}"] = (torch.cat([prompt, extra[: len(tree)]]), None)
            for name, (chain, tree) in sessions.items():
                target = TargetSession(vla.language_model, head)
                target.forward(chain, tree, action_index=0)
                out[name].append(target.forward_ms[-1])
    return {k: {"tokens_over_prompt": 0 if k == "prefill" else int(k.split("_")[1]), **distribution(v)}
            for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--demos", required=True)
    p.add_argument("--tasks", default="0-9")
    p.add_argument("--steps-per-task", type=int, default=40)
    p.add_argument("--pool", type=int, default=20)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vla, prior = load_policy_model(args.model)
    drafter = load_drafter(args.drafter, vla.language_model.config, torch.float32)
    store = make_store(StoreConfig(backend="edge", path=args.db))
    try:
        obs = observations(args.demos, parse_range(args.tasks), args.steps_per_task)
        for o in obs[:10]:  # warm up vision, the store's pages and the LLM
            with torch.inference_mode():
                query, _ = embed_views(vla, [o.images["agentview"]])
            store.search_near(query, o.task_key, args.top_k, o.ee_pos, args.pool)
        cfg = DecoderConfig(method="heisd", fused_metric=FusedMetricConfig(tau=0.0),
                            retrieval=RetrievalConfig(top_k=args.top_k, query_views=1, position_pool=args.pool),
                            verify_skip=VerifySkipConfig(min_similarity=0.5, max_distance_m=0.2,
                                                         max_consecutive_skips=100))
        cfg = dataclasses.replace(cfg, source_choice=dataclasses.replace(cfg.source_choice, enabled=False))
        result = {
            "command": "python benchmarks/retrieval_stage.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "git_rev": git_revision(), "db_points": store.count(), "queries": len(obs),
            "config": vars(args),
            "retrieval_stage_ms": retrieval_stage(vla, store, obs, args.pool, args.top_k),
            "skipped_step": skipped_steps(vla, prior, drafter, store, obs, cfg),
            "first_forward_ms": first_forward(vla, obs, (8, 16, 32), repeats=min(len(obs), 100)),
        }
    finally:
        store.close()
    print(json.dumps(result, indent=1))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
