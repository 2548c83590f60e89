"""Project HeiSD's speedup for OpenVLA-7B from measured component costs and recorded traces.

The GPU run, one command from the repository root of the lent GPU machine (torch, transformers and
safetensors as this repository pins them: carry the transformers wheel of requirements-runtime.txt
where the machine's differs; nothing is downloaded, no checkpoint is needed):

    python3 benchmarks/gpu_projection.py --shape openvla7b --device cuda --traces benchmarks/libero_object.json --out $OUT/gpu_projection.json

about 3-5 minutes: the model is built on the GPU (~1 min), each cost is the median of --repeat runs.
CPU check (the test runs this): --shape tiny --device cpu --dtype float32 --repeat 2.

The model is heisd_ros's native OpenVLA (`heisd_ros.models.openvla.OpenVLAModel`) built from the
config.json of a checkpoint of that shape, with random weights: `openvla7b` has OpenVLA-7B's shapes
(DINOv2 ViT-L/14 + SigLIP SO400M/14 towers at 224 px, 256 patches, fused projector, LLaMA-2-7B with
the padded 32064-row embedding), `tiny` the test preset's. Action token ids come from the action
tokenizer (31744-31999: the last 256 of the unpadded vocabulary), and an EAGLE drafter is built for
its LLM. It times

    vision (1 and 2 views), projector, prefill (prompt), decode (1 token on the cache), fused
    prefill + a retrieval sequence tree, a drafter-tree verification, one drafter round

and combines them with the per-mode mix and forwards per step of a `heisd bench --profile` or
`heisd-libero eval-libero` JSON report to project AR vs HeiSD step time on that device.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # heisd_ros from this checkout, installed or not

from heisd_ros.models.openvla_random import PRESETS

SHAPES = {
    # the random-checkpoint preset whose config.json gives the shape; prompt text tokens after BOS and patches
    "openvla7b": {"checkpoint": PRESETS["openvla-widths"], "text": 20},
    "tiny": {"checkpoint": PRESETS["tiny"], "text": 16},
}


def build(shape_name: str, device: str, dtype: torch.dtype):
    """(arch, OpenVLAModel, EagleDrafter, ActionTokenizer) of `shape_name`, random weights, on `device`."""
    from heisd_ros.core.action_tokenizer import ActionTokenizer
    from heisd_ros.core.drafter import EagleDrafter
    from heisd_ros.models.openvla import OpenVLAModel
    from heisd_ros.models.openvla_config import parse_config
    from heisd_ros.models.openvla_random import make_config

    arch = parse_config(make_config(SHAPES[shape_name]["checkpoint"]), Path(f"{shape_name}/config.json"))
    with torch.device(device):  # initialised where it runs: no 15 GB pass through host memory
        model = OpenVLAModel(arch)
        drafter = EagleDrafter(model.language_model.config)
    return (arch, model.to(dtype).eval(), drafter.to(dtype).eval(),
            ActionTokenizer(arch.action_vocab, arch.n_action_bins))


def timeit(fn, device: str, repeat: int) -> float:
    """Median milliseconds of fn() (device-synchronised)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def trees(first: int, tree_nodes: int, draft_depth: int, draft_top_k: int):
    """(retrieval sequence tree of `tree_nodes` nodes, drafter tree of `draft_depth` levels of
    `draft_top_k` siblings, the first of each level carrying the next), over action token ids from
    `first` (the action tokenizer's: OpenVLA pads its embedding by 64 rows, so not its size - 256).
    A forward's cost depends on the node count only."""
    from heisd_ros.core.tree import DraftTree, chain_tree

    seq_tree = chain_tree([first + i % 256 for i in range(tree_nodes)])
    dtree = DraftTree()
    parent = -1
    for level in range(draft_depth):
        children = [dtree.add(first + (level * draft_top_k + k) % 256, parent) for k in range(draft_top_k)]
        parent = children[0]
    return seq_tree, dtree


@torch.inference_mode()
def measure(shape_name: str, device: str, dtype: torch.dtype, repeat: int, tree_nodes: int, draft_depth: int,
            draft_top_k: int) -> dict:
    from transformers import DynamicCache

    from heisd_ros.core.verifier import build_attention, llama_forward

    t0 = time.perf_counter()
    arch, model, drafter, action_tokens = build(shape_name, device, dtype)
    build_s = time.perf_counter() - t0
    lm = model.language_model
    prompt_len = 1 + arch.patch_tokens + SHAPES[shape_name]["text"]
    d = lm.config.hidden_size
    prompt = torch.randn(prompt_len, d, device=device, dtype=dtype) * 0.02
    px = torch.randn(2, 3 * len(arch.towers), arch.image_size, arch.image_size, device=device, dtype=dtype)
    patches = model.vision_backbone(px[:1])[0]

    def vision(views: int):
        return lambda: model.vision_backbone(px[:views])

    def fresh_prefill():
        cache = DynamicCache(config=lm.config)
        m, p = build_attention(0, prompt_len, None, dtype, torch.device(device))
        llama_forward(lm.model, prompt[None], m, p, cache)
        return cache

    seq_tree, dtree = trees(action_tokens.first_token_id, tree_nodes, draft_depth, draft_top_k)

    def fused():
        cache = DynamicCache(config=lm.config)
        m, p = build_attention(0, prompt_len, seq_tree, dtype, torch.device(device))
        emb = torch.cat([prompt, lm.get_input_embeddings()(torch.tensor(seq_tree.tokens, device=device))])
        llama_forward(lm.model, emb[None], m, p, cache)

    base = fresh_prefill()

    def on_cache(n_new: int, tree=None):
        def run():
            from heisd_ros.core.verifier import compact_cache

            m, p = build_attention(prompt_len, 1, tree, dtype, torch.device(device))
            x = torch.randn(1, 1 + (len(tree) if tree else 0), d, device=device, dtype=dtype) * 0.02
            llama_forward(lm.model, x, m, p, base)
            compact_cache(base, prompt_len, [])
        return run

    from heisd_ros.core.drafter_block import FusedDrafterBlock, causal_visibility

    block = FusedDrafterBlock(drafter)  # the drafter as decoding runs it (torch's kernel off the CPU)
    feats = torch.randn(prompt_len, d, device=device, dtype=dtype) * 0.02
    positions = torch.arange(prompt_len, device=device)
    visible = causal_visibility(0, prompt_len, torch.device(device))

    def drafter_extend():
        block(feats, feats, positions, visible, block.new_cache())

    dcache = block.new_cache()
    block(feats, feats, positions, visible, dcache)
    frontier_positions = torch.full((draft_top_k,), prompt_len, device=device)
    frontier_visible = torch.ones(draft_top_k, prompt_len + draft_top_k, dtype=torch.bool, device=device)

    def drafter_call():
        block(feats[:draft_top_k], feats[:draft_top_k], frontier_positions, frontier_visible, dcache)
        dcache.crop(prompt_len)

    costs = {
        "vision_1view_ms": timeit(vision(1), device, repeat),
        "vision_2views_ms": timeit(vision(2), device, repeat),
        "projector_ms": timeit(lambda: model.projector(patches), device, repeat),
        "prefill_ms": timeit(fresh_prefill, device, repeat),
        "decode_ms": timeit(on_cache(1), device, repeat),
        "fused_prefill_tree_ms": timeit(fused, device, repeat),
        "verify_drafter_tree_ms": timeit(on_cache(1, dtree), device, repeat),
        "drafter_extend_prompt_ms": timeit(drafter_extend, device, repeat),
        "drafter_call_ms": timeit(drafter_call, device, repeat),
    }
    return {"shape": shape_name, "prompt_tokens": prompt_len, "tree_nodes": tree_nodes,
            "drafter_tree_nodes": len(dtree), "build_s": build_s, "costs_ms": costs,
            "model": summary(arch, model, action_tokens)}


def summary(arch, model, action_tokens) -> dict:
    """What was timed: the model class, its size, the action ids and the vision input."""
    return {"class": "heisd_ros.models.openvla.OpenVLAModel (random weights)",
            "parameters": sum(p.numel() for p in model.parameters()),
            "embedding_rows": model.language_model.get_input_embeddings().num_embeddings,
            "action_token_ids": [action_tokens.first_token_id, action_tokens.vocab_size - 1],
            "patch_tokens": arch.patch_tokens, "image_size": arch.image_size,
            "towers": [t.timm_id for t in arch.towers]}


def project(costs: dict, traces: dict, retrieval_ms: float, draft_depth: int) -> dict:
    """AR and HeiSD step time from component costs and a report's per-mode figures (a bench report
    has them under heisd.profile.modes, an eval-libero report under heisd.modes)."""
    c = costs
    ar = c["vision_1view_ms"] + c["projector_ms"] + c["prefill_ms"] + 6 * c["decode_ms"]
    heisd = traces.get("heisd", {})
    modes = heisd.get("profile", {}).get("modes") or heisd.get("modes", {})
    mix = heisd.get("mode_mix", {})
    drafter_round = c["verify_drafter_tree_ms"] + draft_depth * c["drafter_call_ms"]
    per_mode = {  # a skipped step runs neither the projector nor the LLM
        "skip": c["vision_2views_ms"] + retrieval_ms,
        "retrieval": c["vision_2views_ms"] + retrieval_ms + c["projector_ms"] + c["fused_prefill_tree_ms"]
        + max(modes.get("retrieval", {}).get("forwards_per_step", 1.0) - 1.0, 0.0) * drafter_round,
        "drafter": c["vision_1view_ms"] + c["projector_ms"] + c["prefill_ms"] + c["drafter_extend_prompt_ms"]
        + max(modes.get("drafter", {}).get("forwards_per_step", 2.0) - 1.0, 0.0) * drafter_round,
    }
    mean = sum(mix.get(m, 0.0) * t for m, t in per_mode.items())
    return {"ar_step_ms": ar, "heisd_mode_step_ms": per_mode, "heisd_mean_step_ms": mean,
            "mode_mix": mix, "projected_speedup_mean": ar / mean if mean else None,
            "note": "mean over the recorded mode mix; retrieval cost measured on CPU (database in CPU memory)"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="openvla7b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--traces", default="benchmarks/tiny_bench.json", help="bench/eval JSON report with heisd mode mix")
    p.add_argument("--retrieval-ms", type=float, default=None, help="Top-K query cost (default: from the report)")
    p.add_argument("--tree-nodes", type=int, default=32)
    p.add_argument("--draft-depth", type=int, default=5,
                   help="drafter levels a round runs (6 tokens remain; the verify forward yields the last)")
    p.add_argument("--draft-top-k", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--out", default="benchmarks/gpu_projection.json")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (CPU runs only)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    result = measure(args.shape, args.device, dtype, args.repeat, args.tree_nodes, args.draft_depth, args.draft_top_k)
    traces = json.loads(Path(args.traces).read_text()) if Path(args.traces).is_file() else {}
    retrieval = args.retrieval_ms
    if retrieval is None:
        retrieval = traces.get("heisd", {}).get("profile", {}).get("stage_median_ms", {}).get("retrieval")
        retrieval = retrieval or traces.get("_meta", {}).get("retrieval_latency_ms", {}).get("median", 1.0)
    result["projection"] = project(result["costs_ms"], traces, retrieval, args.draft_depth)
    result["_meta"] = {"device": args.device, "dtype": args.dtype, "traces": args.traces, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor(),
                       "repeat": args.repeat}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({"model": result["model"], "costs_ms": result["costs_ms"], "projection": result["projection"]},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
