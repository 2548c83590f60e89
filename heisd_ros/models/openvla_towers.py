"""OpenVLA's vision backbone and projector, with the parameter names of its published checkpoints.

Each tower is the ViT timm builds for the checkpoint's model id (`heisd_ros.models.openvla_config`
says which): `patch_embed.proj`, `cls_token`, `reg_token`, `pos_embed`, `blocks.N.{norm1, attn.qkv,
attn.proj, ls1, norm2, mlp.fc1, mlp.fc2, ls2}`, `norm`, and for SigLIP `attn_pool.*`. OpenVLA renamed
LayerScale's `gamma` to `scale_factor` (transformers rewrites parameters named gamma), so that is
the name here too. The towers are written out rather than taken from timm because timm cannot be
imported without torchvision, which has no wheel for the CPU build of torch this project pins.

Features are the output of the second-to-last block with the prefix (class, register) tokens
dropped: OpenVLA reads `get_intermediate_layers(n={depth - 2})`, without the final norm. The last
block, the final norm and the attention-pool head are loaded (the checkpoints carry them) and
never run. Fused backbones stack both towers' inputs on channels ([B, 6, S, S]) and concatenate
their features on channels, the first tower (`featurizer`) first.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from heisd_ros.models.openvla_config import OpenVLAArch, TowerSpec

LAYER_NORM_EPS = 1e-6
"""timm's ViT LayerNorm epsilon."""


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): CLIP's activation (timm's `quick_gelu`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_activation(name: str) -> nn.Module:
    if name == "quick_gelu":
        return QuickGELU()
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


class PatchEmbed(nn.Module):
    """images [B, 3, S, S] -> patch embeddings [B, (S/p)^2, D] (row-major patch order)."""

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, spec.embed_dim, spec.patch_size, stride=spec.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection: [B, N, D] -> [B, N, D]."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class LayerScale(nn.Module):
    """Per-channel residual scale (DINOv2)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale_factor = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale_factor


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str = "gelu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = make_activation(act)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + ls1(attn(norm1 x)), then x + ls2(mlp(norm2 x))."""

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        dim = spec.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.attn = Attention(dim, spec.num_heads)
        self.ls1 = LayerScale(dim) if spec.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.mlp = Mlp(dim, spec.mlp_hidden, spec.act)
        self.ls2 = LayerScale(dim) if spec.layer_scale else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class AttentionPoolHead(nn.Module):
    """The parameters of timm's latent-query attention pool (SigLIP's `attn_pool`). OpenVLA never
    runs it, so it has no forward; it exists so that the checkpoint's tensors have a home."""

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        dim = spec.embed_dim
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.mlp = Mlp(dim, spec.mlp_hidden)


class VisionTower(nn.Module):
    """One ViT: images [B, 3, S, S] -> patch features of the second-to-last block [B, (S/p)^2, D]."""

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.spec = spec
        dim = spec.embed_dim
        self.patch_embed = PatchEmbed(spec)
        if spec.class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        if spec.reg_tokens:
            self.reg_token = nn.Parameter(torch.zeros(1, spec.reg_tokens, dim))
        positions = spec.grid ** 2 + (0 if spec.no_embed_class else spec.prefix_tokens)
        self.pos_embed = nn.Parameter(torch.zeros(1, positions, dim))
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        if spec.attn_pool:
            self.attn_pool = AttentionPoolHead(spec)

    def _prefixed(self, x: torch.Tensor) -> torch.Tensor:
        """Patch embeddings [B, N, D] -> [class, registers, patches] with position embeddings."""
        prefix = []
        if self.spec.class_token:
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.spec.reg_tokens:
            prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        if self.spec.no_embed_class:  # positions cover the patches only: add, then prepend
            return torch.cat(prefix + [x + self.pos_embed], dim=1)
        return torch.cat(prefix + [x], dim=1) + self.pos_embed

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self._prefixed(self.patch_embed(pixels))
        for block in self.blocks[: self.spec.depth - 1]:
            x = block(x)
        return x[:, self.spec.prefix_tokens:]


class PrismaticBackbone(nn.Module):
    """pixels [B, 3 * towers, S, S] (each tower's normalisation, stacked on channels) -> patch
    features [B, N, C] with C the towers' widths added (`out_dim`)."""

    def __init__(self, arch: OpenVLAArch) -> None:
        super().__init__()
        self.featurizer = VisionTower(arch.towers[0])
        self.fused_featurizer = VisionTower(arch.towers[1]) if arch.fused else None
        self.out_dim = arch.vision_dim

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.fused_featurizer is None:
            return self.featurizer(pixels)
        first, second = torch.split(pixels, [3, 3], dim=1)
        return torch.cat([self.featurizer(first), self.fused_featurizer(second)], dim=2)


class PrismaticProjector(nn.Module):
    """patch features [..., C] -> LLM embeddings [..., D]: fc1-GELU-fc2, and for fused backbones
    fc1 (C -> 4C)-GELU-fc2 (4C -> D)-GELU-fc3 (D -> D)."""

    def __init__(self, arch: OpenVLAArch) -> None:
        super().__init__()
        vision, hidden = arch.vision_dim, int(arch.text["hidden_size"])
        if arch.projector_layers == 3:
            self.fc1 = nn.Linear(vision, 4 * vision)
            self.fc2 = nn.Linear(4 * vision, hidden)
            self.fc3 = nn.Linear(hidden, hidden)
        else:
            self.fc1 = nn.Linear(vision, hidden)
            self.fc2 = nn.Linear(hidden, hidden)
            self.fc3 = None
        self.act = nn.GELU()

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = self.fc2(self.act(self.fc1(patches)))
        return x if self.fc3 is None else self.fc3(self.act(x))
