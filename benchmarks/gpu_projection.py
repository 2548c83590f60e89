"""Project HeiSD's speedup for OpenVLA-7B from measured component costs and recorded traces.

One prepared script for a lent GPU machine (torch + transformers only, nothing to install, no
download): it builds a random-initialised OpenVLA-7B-shaped model (DINOv2-L/14 + SigLIP-So400m/14
vision towers at 224 px -> 256 patches, LLaMA-2-7B decoder, one-block EAGLE drafter), times

    vision (1 and 2 views), prefill (prompt), decode (1 token on the cache), fused prefill + a
    retrieval sequence tree, a drafter-tree verification, one drafter round (extend + expansion)

and combines them with the per-mode mix and forwards per step recorded by `heisd bench --profile`
or `heisd eval-libero` (JSON report) to project AR vs HeiSD step time on that GPU.

    python benchmarks/gpu_projection.py --shape openvla7b --traces benchmarks/libero_object.json \
        --out benchmarks/gpu_projection.json          # on the GPU machine, about 3-5 minutes
    python benchmarks/gpu_projection.py --shape tiny --device cpu --out /tmp/p.json   # CI

Sized for one device call of at most 6 minutes: model build ~1-2 min, timings ~1 min.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, vocab, vision towers [(hidden, layers, heads, mlp)], patches
    "openvla7b": dict(hidden=4096, inter=11008, layers=32, heads=32, kv=32, vocab=32064,
                      towers=[(1024, 24, 16, 4096), (1152, 27, 16, 4304)], image=224, patch=14, text=20),
    "tiny": dict(hidden=128, inter=256, layers=4, heads=4, kv=2, vocab=640,
                 towers=[(64, 2, 4, 128)], image=64, patch=16, text=16),
}


def build(shape: dict, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM, ViTConfig, ViTModel

    llm_cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["inter"],
                          num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                          num_key_value_heads=shape["kv"], max_position_embeddings=2048, attn_implementation="sdpa")
    draft_cfg = LlamaConfig(**{**llm_cfg.to_dict(), "num_hidden_layers": 1, "vocab_size": 1,
                               "bos_token_id": None, "eos_token_id": None, "pad_token_id": None})
    with torch.device(device):
        lm = LlamaForCausalLM(llm_cfg).to(dtype).eval()
        towers = [ViTModel(ViTConfig(hidden_size=h, num_hidden_layers=n, num_attention_heads=a, intermediate_size=m,
                                     image_size=shape["image"], patch_size=shape["patch"]),
                           add_pooling_layer=False).to(dtype).eval() for h, n, a, m in shape["towers"]]
        from heisd_ros.core.drafter import EagleDrafter

        drafter = EagleDrafter(llm_cfg).to(dtype).eval()
    del draft_cfg
    return lm, towers, drafter


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


@torch.inference_mode()
def measure(shape_name: str, device: str, dtype: torch.dtype, repeat: int, tree_nodes: int, draft_depth: int,
            draft_top_k: int) -> dict:
    from transformers import DynamicCache

    from heisd_ros.core.tree import chain_tree, DraftTree
    from heisd_ros.core.verifier import build_attention, llama_forward

    shape = SHAPES[shape_name]
    t0 = time.perf_counter()
    lm, towers, drafter = build(shape, device, dtype)
    build_s = time.perf_counter() - t0
    n_patch = (shape["image"] // shape["patch"]) ** 2
    prompt_len = 1 + n_patch + shape["text"]
    d = shape["hidden"]
    prompt = torch.randn(prompt_len, d, device=device, dtype=dtype) * 0.02
    px = torch.randn(2, 3, shape["image"], shape["image"], device=device, dtype=dtype)

    def vision(views: int):
        return lambda: [t(pixel_values=px[:views]) for t in towers]

    def fresh_prefill():
        cache = DynamicCache(config=lm.config)
        m, p = build_attention(0, prompt_len, None, dtype, torch.device(device))
        llama_forward(lm.model, prompt[None], m, p, cache)
        return cache

    first = lm.config.vocab_size - 256
    seq_tree = chain_tree([first + i % 256 for i in range(tree_nodes)])  # cost depends on the node count only
    dtree = DraftTree()  # depth levels of top_k siblings, the first of each level carrying the next
    parent = -1
    for level in range(draft_depth):
        children = [dtree.add(first + level * draft_top_k + k, parent) for k in range(draft_top_k)]
        parent = children[0]

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

    dcache = DynamicCache(config=drafter.config)
    feats = torch.randn(prompt_len, d, device=device, dtype=dtype) * 0.02

    def drafter_extend():
        m, p = build_attention(0, prompt_len, None, dtype, torch.device(device))
        drafter(feats, feats, attention_mask=m, position_ids=p, cache=DynamicCache(config=drafter.config))

    m0, p0 = build_attention(0, prompt_len, None, dtype, torch.device(device))
    drafter(feats, feats, attention_mask=m0, position_ids=p0, cache=dcache)

    def drafter_call():
        from heisd_ros.core.verifier import compact_cache

        m, p = build_attention(prompt_len, draft_top_k, None, dtype, torch.device(device))
        drafter(feats[:draft_top_k], feats[:draft_top_k], attention_mask=m, position_ids=p, cache=dcache)
        compact_cache(dcache, prompt_len, [])

    costs = {
        "vision_1view_ms": timeit(vision(1), device, repeat),
        "vision_2views_ms": timeit(vision(2), device, repeat),
        "prefill_ms": timeit(fresh_prefill, device, repeat),
        "decode_ms": timeit(on_cache(1), device, repeat),
        "fused_prefill_tree_ms": timeit(fused, device, repeat),
        "verify_drafter_tree_ms": timeit(on_cache(1, dtree), device, repeat),
        "drafter_extend_prompt_ms": timeit(drafter_extend, device, repeat),
        "drafter_call_ms": timeit(drafter_call, device, repeat),
    }
    return {"shape": shape_name, "prompt_tokens": prompt_len, "tree_nodes": tree_nodes,
            "drafter_tree_nodes": len(dtree), "build_s": build_s, "costs_ms": costs}


def project(costs: dict, traces: dict, retrieval_ms: float, draft_depth: int) -> dict:
    """AR and HeiSD step time from component costs and a report's per-mode figures."""
    c = costs
    ar = c["vision_1view_ms"] + c["prefill_ms"] + 6 * c["decode_ms"]
    heisd = traces.get("heisd", {})
    modes = heisd.get("profile", {}).get("modes", {})
    mix = heisd.get("mode_mix", {})
    drafter_round = c["verify_drafter_tree_ms"] + draft_depth * c["drafter_call_ms"]
    per_mode = {
        "skip": c["vision_2views_ms"] + retrieval_ms,
        "retrieval": c["vision_2views_ms"] + retrieval_ms + c["fused_prefill_tree_ms"]
        + max(modes.get("retrieval", {}).get("forwards_per_step", 1.0) - 1.0, 0.0) * drafter_round,
        "drafter": c["vision_1view_ms"] + c["prefill_ms"] + c["drafter_extend_prompt_ms"]
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
    p.add_argument("--draft-depth", type=int, default=6)
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
    print(json.dumps({"costs_ms": result["costs_ms"], "projection": result["projection"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
