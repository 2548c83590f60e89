"""Micro-benchmarks of one policy's building blocks, fp32 and bf16 (one thread, medians of 30 repeats).

Vision on two views (batched vs one call per view), the prompt prefill (the lean `llama_forward` vs
the model's own forward), the fused prefill-verify forward (prompt + 35 tree tokens) and one decode
on the KV cache. Random images, the model's real weights.

    python benchmarks/micro.py --model artifacts/tiny/model [--json benchmarks/micro.json --key tiny]

With --json, the figures go under --key in that file (its other keys are kept: one report holds
the tiny model's and the mini VLA's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def med_ms(fn, repeat: int = 30) -> float:
    fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


@torch.inference_mode()
def run(model_dir: str) -> dict:
    from transformers import DynamicCache

    from heisd_ros.core.verifier import build_attention, llama_forward
    from heisd_ros.models.loader import load_vla

    res: dict = {}
    for dtype in ("float32", "bfloat16"):
        vla = load_vla(model_dir, dtype=dtype)
        lm = vla.language_model
        imgs = [np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8) for _ in range(2)]
        px = vla.preprocess(imgs)
        prompt = vla.prompt_embeds("pick up the bowl", vla.projector(vla.vision_backbone(px[:1]))[0])
        p_len = prompt.shape[1]
        r = res[dtype] = {"prompt_tokens": p_len}
        r["vision_2views_batched_ms"] = med_ms(lambda: vla.vision_backbone(px))
        r["vision_2views_sequential_ms"] = med_ms(lambda: [vla.vision_backbone(px[i : i + 1]) for i in range(2)])

        def prefill(lean: bool):
            cache = DynamicCache(config=lm.config)
            m, p = build_attention(0, p_len, None, prompt.dtype, prompt.device)
            if lean:
                return llama_forward(lm.model, prompt, m, p, cache), cache
            return lm.model(inputs_embeds=prompt, attention_mask=m, position_ids=p, cache=cache, use_cache=True), cache

        r["prefill_lean_ms"] = med_ms(lambda: prefill(True))
        # the fused prefill-verify forward: prompt + a retrieval tree (cost depends on the token count,
        # not on the mask's shape, so a causal mask over prompt + 35 tokens stands in for it)
        fused = torch.cat([prompt, prompt[:, :35]], dim=1)

        def fused_forward():
            m, p = build_attention(0, fused.shape[1], None, fused.dtype, fused.device)
            return llama_forward(lm.model, fused, m, p, DynamicCache(config=lm.config))

        r["fused_prefill_35_tree_tokens_ms"] = med_ms(fused_forward)
        r["prefill_wrapped_ms"] = med_ms(lambda: prefill(False))
        _, cache = prefill(True)
        x = prompt[:, :1]

        def decode(lean: bool):
            from heisd_ros.core.verifier import compact_cache

            m, p = build_attention(p_len, 1, None, x.dtype, x.device)
            if lean:
                llama_forward(lm.model, x, m, p, cache)
            else:
                lm.model(inputs_embeds=x, attention_mask=m, position_ids=p, cache=cache, use_cache=True)
            compact_cache(cache, p_len, [])

        r["decode_lean_ms"] = med_ms(lambda: decode(True))
        r["decode_wrapped_ms"] = med_ms(lambda: decode(False))
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="artifacts/tiny/model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="")
    p.add_argument("--key", default="tiny", help="the entry of --json the figures go under")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    res = run(args.model)
    print(json.dumps(res, indent=2))
    if args.json:
        path = Path(args.json)
        report = json.loads(path.read_text()) if path.is_file() else {}
        report[args.key] = {"model": args.model, "threads": args.threads, **res}
        path.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
