"""How a checkpoint is loaded: one value shared by the decoder, the node and every tool.

A database, a calibration and a drafter are built from a model loaded one way (its dtype, the
dataset statistics that tokenise actions, OpenVLA's centre crop); loading it another way at run
time would compare features and tokens that were never comparable. So the tools and the node all
build a `ModelSpec`, `heisd build-db` records its `recorded()` fields in the database manifest,
and configure refuses a database whose record differs (`check_database`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

from heisd_ros.core.errors import ConfigError, DatabaseError
from heisd_ros.models.dtypes import DTYPES
from heisd_ros.models.packed_linear import LLM_LINEARS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """A model directory and the way it is loaded."""

    directory: str
    """The checkpoint directory (a heisd VLA or an OpenVLA checkpoint; read offline)."""
    dtype: str = "float32"
    """float32, bfloat16 or float16."""
    device: str = "cpu"
    """torch device ('cpu', 'cuda', 'cuda:1')."""
    unnorm_key: str = ""
    """The dataset statistics that (un)normalise actions ('' = the model's only or default one)."""
    center_crop: bool = False
    """OpenVLA's 90 % centre crop of every frame (OpenVLA checkpoints only)."""
    llm_linear: str = "torch"
    """The LLM decoder layers' linear kernel: 'torch', or 'onednn' (packed once; float32 CPU only,
    heisd_ros/models/packed_linear.py). Decoding loads with `decoder.llm_linear` (`of_decoder`);
    a tool that trains or embeds keeps torch's."""

    def __post_init__(self) -> None:
        if not self.directory:
            raise ConfigError("a model directory is required")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unsupported dtype {self.dtype!r}; one of {list(DTYPES)}")
        if self.llm_linear not in LLM_LINEARS:
            raise ConfigError(f"llm_linear must be one of {LLM_LINEARS}, got {self.llm_linear!r}")

    @classmethod
    def of_decoder(cls, directory: str, cfg: Any) -> ModelSpec:
        """The spec a DecoderConfig (`dtype`, `device`, `unnorm_key`, `center_crop`, `llm_linear`) runs `directory` with."""
        return cls(directory, cfg.dtype, cfg.device, cfg.unnorm_key, cfg.center_crop, cfg.llm_linear)

    def recorded(self) -> dict[str, Any]:
        """What a database built from this model records of how it was loaded (its manifest)."""
        return {"dtype": self.dtype, "unnorm_key": self.unnorm_key, "center_crop": self.center_crop}

    def check_database(self, manifest: Mapping[str, Any] | None, where: str) -> None:
        """Refuse a database built from the model loaded otherwise (DatabaseError): its vectors embed
        other pixels (centre crop) or its tokens other statistics (unnorm_key). A dtype difference
        only warns: the vectors stay comparable, but verify-skip's near-1 similarities rarely pass.
        Manifests of earlier builds lack some fields; what they lack is their build's default. An
        empty unnorm_key means the model's default, which only the model knows: it matches any."""
        if manifest is None:
            return
        built_crop = bool(manifest.get("center_crop", False))
        if built_crop != self.center_crop:
            way = {True: "with", False: "without"}
            raise DatabaseError(f"the database at {where} was built {way[built_crop]} the centre crop, the policy "
                                f"runs {way[self.center_crop]} it: decoder.center_crop must match "
                                "build-db --center-crop")  # fmt: skip
        built_key = str(manifest.get("unnorm_key", ""))
        if built_key and self.unnorm_key and built_key != self.unnorm_key:  # '' is the model's default
            raise DatabaseError(f"the database at {where} tokenised its actions with unnorm_key {built_key!r}, the "
                                f"policy runs {self.unnorm_key!r}: decoder.unnorm_key must match build-db "
                                "--unnorm-key")  # fmt: skip
        built_dtype = str(manifest.get("dtype", "float32"))
        if built_dtype != self.dtype:
            log.warning("the database at %s was embedded at %s, the policy runs at %s: verify-skip compares "
                        "features near 0.9995 similarity and will rarely pass (heisd build-db --dtype %s)",
                        where, built_dtype, self.dtype, self.dtype)
