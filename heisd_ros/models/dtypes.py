"""The dtypes a model may run in, by the names configurations and command lines use."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Configuration name -> torch dtype."""
