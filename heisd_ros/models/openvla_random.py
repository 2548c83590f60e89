"""OpenVLA checkpoints with random weights, in the published layout (tests, load measurements).

`write_random_checkpoint` writes what an OpenVLA checkpoint directory holds: config.json (the
published fields, `auto_map` included), sharded safetensors with `model.safetensors.index.json`
under the published tensor names, a LLaMA-2-shaped tokenizer (`openvla_tokenizer`),
preprocessor_config.json and dataset_statistics.json. Tensors are drawn one shard at a time
(never the whole model in memory), so checkpoints with OpenVLA's real widths can be written on a
small machine. `measure_load` loads one and reports the process's peak memory against the
weights' size.
"""

from __future__ import annotations

import json
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from heisd_ros.models.openvla_config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    LLAMA2_DEFAULTS,
    parse_config,
)
from heisd_ros.models.openvla_tokenizer import (
    LLAMA2_VOCAB,
    build_llama_like_tokenizer,
    write_tokenizer_files,
)
from heisd_ros.models.openvla_weights import INDEX_FILE, empty_model

TOWERS = {
    "dinosiglip": ("dinosiglip-vit-so-224px",
                   ("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224")),
    "dinov2": ("dinov2-vit-l", ("vit_large_patch14_reg4_dinov2.lvd142m",)),
    "siglip": ("siglip-vit-so400m", ("vit_so400m_patch14_siglip_224",)),
}
"""--towers choices -> (vision_backbone_id, timm model ids)."""
UNNORM_KEYS = ("bridge_orig", "libero_spatial_no_noops")
PAD_MULTIPLE = 64


@dataclass(frozen=True)
class RandomCheckpoint:
    """What `write_random_checkpoint` makes. Width fields left None keep OpenVLA's own."""

    towers: str = "dinosiglip"
    """'dinosiglip' (fused DINOv2 + SigLIP, as OpenVLA), 'dinov2' or 'siglip' (single tower)."""
    image_size: int = 224
    vit_widths: tuple[int, ...] | None = None
    """Embedding width of each tower (None: 1024 for DINOv2, 1152 for SigLIP)."""
    vit_depth: int | None = None
    vit_heads: int | None = None
    llm_layers: int = 32
    llm_width: int = 4096
    llm_intermediate: int = 11008
    llm_heads: int = 32
    dtype: str = "bfloat16"
    seed: int = 0
    shard_mb: float = 2000.0
    """Largest shard in MiB (a tensor larger than that gets a shard of its own)."""
    resize_strategy: str = "resize-naive"

    def __post_init__(self) -> None:
        if self.towers not in TOWERS:
            raise ValueError(f"towers must be one of {sorted(TOWERS)}")
        if self.vit_widths is not None and len(self.vit_widths) != len(TOWERS[self.towers][1]):
            raise ValueError(f"vit_widths needs one width per tower ({len(TOWERS[self.towers][1])})")
        if self.llm_width % self.llm_heads or self.llm_layers < 1 or self.shard_mb <= 0:
            raise ValueError("llm_width must divide by llm_heads, llm_layers >= 1, shard_mb > 0")


PRESETS = {
    "tiny": RandomCheckpoint(image_size=56, vit_widths=(32, 48), vit_depth=3, vit_heads=2, llm_layers=2,
                             llm_width=64, llm_intermediate=172, llm_heads=4, dtype="float32", shard_mb=4.0),
    "openvla-widths": RandomCheckpoint(),
}
"""tiny: 16 patches from 3-block ViTs and a 2-layer LLaMA of width 64 (fast tests); openvla-widths:
OpenVLA's own widths (ViT-L/14 DINOv2, SO400M/14 SigLIP, LLaMA-2-7B), 32 layers unless changed."""


def _tower_kwargs(spec: RandomCheckpoint) -> list[dict] | None:
    n = len(TOWERS[spec.towers][1])
    kwargs: list[dict] = [{} for _ in range(n)]
    for i in range(n):
        if spec.vit_widths is not None:
            kwargs[i]["embed_dim"] = spec.vit_widths[i]
        if spec.vit_depth is not None:
            kwargs[i]["depth"] = spec.vit_depth
        if spec.vit_heads is not None:
            kwargs[i]["num_heads"] = spec.vit_heads
    return kwargs if any(kwargs) else None


def _statistics(spec: RandomCheckpoint) -> dict:
    """Action (and proprio) statistics per dataset, in the published layout."""
    out = {}
    for k, key in enumerate(UNNORM_KEYS):
        q = [0.01 * (k + 1) * (i + 1) for i in range(7)]
        action = {"mean": [0.0] * 7, "std": [1.0] * 7, "max": [2 * v for v in q], "min": [-2 * v for v in q],
                  "q01": [-v for v in q[:6]] + [0.0], "q99": q[:6] + [1.0], "mask": [True] * 6 + [False]}
        proprio = {name: [0.0] * 7 for name in ("mean", "std", "max", "min", "q01", "q99")}
        out[key] = {"action": action, "proprio": proprio, "num_transitions": 1000 * (k + 1), "num_trajectories": 10}
    return out


def make_config(spec: RandomCheckpoint) -> dict:
    """config.json as an OpenVLA checkpoint has it (text_config: only fields that differ from LLaMA-2-7B)."""
    backbone, ids = TOWERS[spec.towers]
    fused = len(ids) == 2
    llm = {"hidden_size": spec.llm_width, "intermediate_size": spec.llm_intermediate,
           "num_hidden_layers": spec.llm_layers, "num_attention_heads": spec.llm_heads}
    text = {k: v for k, v in llm.items() if LLAMA2_DEFAULTS[k] != v}
    text.update(model_type="llama", pad_token_id=LLAMA2_VOCAB, torch_dtype=spec.dtype,
                vocab_size=LLAMA2_VOCAB + PAD_MULTIPLE)
    config = {
        "arch_specifier": "no-align+fused-gelu-mlp" if fused else "no-align+gelu-mlp",
        "architectures": ["OpenVLAForActionPrediction"],
        "auto_map": {"AutoConfig": "configuration_prismatic.OpenVLAConfig",
                     "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction"},
        "hf_llm_id": "meta-llama/Llama-2-7b-hf", "image_resize_strategy": spec.resize_strategy,
        "image_sizes": [spec.image_size] * len(ids), "llm_backbone_id": "llama2-7b-pure", "llm_max_length": 2048,
        "model_type": "openvla", "n_action_bins": 256, "norm_stats": _statistics(spec),
        "output_projector_states": False, "pad_to_multiple_of": PAD_MULTIPLE, "pad_token_id": LLAMA2_VOCAB,
        "text_config": text, "timm_model_ids": list(ids), "timm_override_act_layers": [None] * len(ids),
        "torch_dtype": spec.dtype, "transformers_version": "4.40.1", "use_fused_vision_backbone": fused,
        "vision_backbone_id": backbone,
    }
    kwargs = _tower_kwargs(spec)
    if kwargs:
        config["timm_model_kwargs"] = kwargs
    return config


def _preprocessor(config: dict) -> dict:
    ids = config["timm_model_ids"]
    norm = [(IMAGENET_MEAN, IMAGENET_STD) if "dinov2" in i else ((0.5,) * 3, (0.5,) * 3) for i in ids]
    return {
        "auto_map": {"AutoImageProcessor": "processing_prismatic.PrismaticImageProcessor",
                     "AutoProcessor": "processing_prismatic.PrismaticProcessor"},
        "image_processor_type": "PrismaticImageProcessor", "processor_class": "PrismaticProcessor",
        "image_resize_strategy": config["image_resize_strategy"],
        "input_sizes": [[3, s, s] for s in config["image_sizes"]], "interpolations": ["bicubic"] * len(ids),
        "means": [list(m) for m, _ in norm], "stds": [list(s) for _, s in norm],
        "use_fused_vision_backbone": config["use_fused_vision_backbone"],
    }


def _random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Norm weights and layer scales 1, biases 0, embeddings N(0, 1), other weights N(0, 1/fan_in)
    (so activations keep their scale and greedy actions depend on the image)."""
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf == "weight" or leaf == "scale_factor":
        return torch.ones(shape, dtype=dtype)
    if leaf == "bias":
        return torch.zeros(shape, dtype=dtype)
    unit = "embed_tokens" in name or len(shape) < 2 or leaf in ("pos_embed", "cls_token", "reg_token", "latent")
    std = 1.0 if unit else 1.0 / math.sqrt(math.prod(shape[1:]))
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen).to(dtype)


def _write_shards(directory: Path, shapes: dict[str, tuple[int, ...]], spec: RandomCheckpoint) -> int:
    """Draw and save the tensors shard by shard; write the index. Returns the weight bytes."""
    from safetensors.torch import save_file

    from heisd_ros.models.dtypes import DTYPES

    dtype = DTYPES[spec.dtype]
    item = torch.empty((), dtype=dtype).element_size()
    limit = spec.shard_mb * 2**20
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * item
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    gen = torch.Generator().manual_seed(spec.seed)
    weight_map, total = {}, 0
    for i, names in enumerate(groups, 1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        shard = {n: _random_tensor(n, shapes[n], dtype, gen) for n in names}
        total += sum(t.numel() * t.element_size() for t in shard.values())
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in names})
        del shard
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                   indent=2))
    return total


def write_random_checkpoint(directory: str | Path, spec: RandomCheckpoint = PRESETS["tiny"]) -> dict:
    """Write a random-weight checkpoint in the published layout; returns a summary."""
    from heisd_ros.models.openvla import OpenVLAModel

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    config = make_config(spec)
    arch = parse_config(config, d / "config.json")
    model = empty_model(lambda: OpenVLAModel(arch))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    (d / "config.json").write_text(json.dumps(config, indent=2))
    (d / "preprocessor_config.json").write_text(json.dumps(_preprocessor(config), indent=2))
    (d / "dataset_statistics.json").write_text(json.dumps(config["norm_stats"], indent=2))
    write_tokenizer_files(d, build_llama_like_tokenizer())
    weight_bytes = _write_shards(d, shapes, spec)
    return {"directory": str(d), "tensors": len(shapes), "weight_bytes": weight_bytes,
            "parameters": sum(math.prod(s) for s in shapes.values())}


def _rss_bytes() -> int:
    """The process's resident memory now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@dataclass
class LoadMeasurement:
    """Memory of one `load_openvla` call in a fresh process (bytes)."""

    rss_before: int
    peak_rss: int
    rss_after: int
    weight_bytes: int
    load_s: float
    ratios: dict = field(default_factory=dict)


def measure_load(directory: str, dtype: str = "bfloat16", unnorm_key: str | None = UNNORM_KEYS[0]) -> dict:
    """Load `directory` and report peak RSS (getrusage) against the loaded weights' bytes. Run it
    in a fresh process: the peak is the process's lifetime high-water mark."""
    import transformers.models.llama.modeling_llama  # noqa: F401 - imported before the baseline

    from heisd_ros.models.openvla import load_openvla

    before = _rss_bytes()
    t0 = time.perf_counter()
    vla = load_openvla(directory, dtype=dtype, device="cpu", unnorm_key=unnorm_key)
    load_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    weights = sum(p.numel() * p.element_size() for p in vla.model.parameters())
    m = LoadMeasurement(before, peak, _rss_bytes(), weights, round(load_s, 2))
    m.ratios = {"peak_over_weights": round(peak / weights, 3),
                "peak_minus_baseline_over_weights": round((peak - before) / weights, 3)}
    return m.__dict__
