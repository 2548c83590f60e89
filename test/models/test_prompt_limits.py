"""What a model tells a caller about its limits before a step: its input frame, its positions, the
tokens of an instruction and the length of the prompt it would build (equal to what
`prompt_embeds` builds), and a prompt cache that cannot grow without bound."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from heisd_ros.core.engine import prompt_patches
from heisd_ros.models.loader import tiny_vla, tiny_vla_config
from heisd_ros.models.text_tokenizer import PROMPT_CACHE_SIZE, HashWordTokenizer, prompt_text


@pytest.mark.parametrize("prompt_views, proprio", [(1, False), (2, True)])
def test_prompt_length_is_what_prompt_embeds_builds(prompt_views, proprio):
    extra = dict(proprio_dim=3, proprio_mean=(0.0, 0.0, 0.0), proprio_std=(1.0, 1.0, 1.0)) if proprio else {}
    vla = tiny_vla(seed=0, cfg=dataclasses.replace(tiny_vla_config(), prompt_views=prompt_views, **extra))
    assert vla.input_hw == (64, 64) and vla.max_positions == 1024 and vla.patch_tokens == 16
    images = [np.zeros((64, 64, 3), np.uint8)] * 2
    with torch.inference_mode():
        visual = vla.projector(prompt_patches(vla, vla.vision_backbone(vla.preprocess(images))))
        for text in ("pick up the red bowl.", "Put it in the basket, then stop", "a"):
            emb = vla.prompt_embeds(text, visual, state=np.zeros(3) if proprio else None)
            assert emb.shape[1] == vla.prompt_length(text)


def test_instruction_tokens_count_the_instruction_alone():
    vla = tiny_vla(seed=0)
    assert vla.instruction_tokens("Pick up the red bowl.") == 5  # the final full stop is dropped
    tok = HashWordTokenizer(200)
    for text in ("pick up the bowl, then stop!", "İstanbul çay", ""):
        assert tok.count(text) == len(tok.encode(text)) - 1
    assert prompt_text("  Pick up the bowl. ") == "pick up the bowl"


def test_prompt_cache_is_bounded():
    vla = tiny_vla(seed=0)
    for k in range(3 * PROMPT_CACHE_SIZE):
        vla.prompt_length(f"task number {k}")
    assert len(vla._prompt_cache) <= PROMPT_CACHE_SIZE
