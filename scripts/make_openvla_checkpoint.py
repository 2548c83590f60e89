#!/usr/bin/env python3
"""Write an OpenVLA checkpoint with random weights in the published layout, and measure its load.

usage: scripts/make_openvla_checkpoint.py OUT [--preset tiny|openvla-widths] [--towers dinosiglip|dinov2|siglip]
           [--image-size S] [--vit-widths W[,W]] [--vit-depth N] [--vit-heads N] [--llm-layers N]
           [--llm-width D] [--llm-intermediate N] [--llm-heads N] [--dtype bfloat16|float16|float32]
           [--seed N] [--shard-mb MB] [--resize-strategy S] [--measure-load] [--measure-only]

The checkpoint (config.json, sharded safetensors + index, tokenizer files, preprocessor_config.json,
dataset_statistics.json) loads with `heisd_ros.models.openvla.load_openvla`. Flags override the
preset's fields (heisd_ros.models.openvla_random.RandomCheckpoint). --measure-load: afterwards,
load OUT in a fresh process and report its peak RSS against the weights' bytes (target: <= 1.3x);
--measure-only: measure an existing OUT without writing. Prints one JSON object.

example (OpenVLA's widths, 2 LLaMA layers, ~2.8 GB in bf16):
    scripts/make_openvla_checkpoint.py /tmp/ovla --preset openvla-widths --llm-layers 2 --measure-load
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import sys

from heisd_ros.models.openvla_random import (
    PRESETS,
    RandomCheckpoint,
    measure_load,
    write_random_checkpoint,
)
from heisd_ros.pipeline.outputs import git_revision


def _widths(text: str) -> tuple[int, ...]:
    return tuple(int(w) for w in text.split(","))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="checkpoint directory to write (or measure)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for f in dataclasses.fields(RandomCheckpoint):
        kind = _widths if f.name == "vit_widths" else type(f.default) if f.default is not None else int
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None,
                       help=f"overrides the preset's {f.name}")
    p.add_argument("--measure-load", action="store_true", help="load OUT in a fresh process and report peak RSS")
    p.add_argument("--measure-only", action="store_true", help="measure an existing OUT, write nothing")
    return p


def _measured(out: str, dtype: str) -> dict:
    # A fresh interpreter: the peak RSS is a lifetime high-water mark, and writing raised ours.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure_load, (out, dtype))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(RandomCheckpoint)
                 if getattr(args, f.name) is not None}
    try:
        spec = dataclasses.replace(PRESETS[args.preset], **overrides)
    except ValueError as err:
        print(f"make_openvla_checkpoint: {err}", file=sys.stderr)
        return 2
    result = {"config": dataclasses.asdict(spec), "preset": args.preset, "seed": spec.seed,
              "git_revision": git_revision()}
    if not args.measure_only:
        result["checkpoint"] = write_random_checkpoint(args.out, spec)
    if args.measure_load or args.measure_only:
        result["load"] = _measured(args.out, spec.dtype)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
