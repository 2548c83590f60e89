"""Prompt tokenizers: a deterministic word-hash tokenizer for tiny test models, HF tokenizers otherwise."""

from __future__ import annotations

import re
import zlib
from typing import Protocol

PROMPT_TEMPLATE = "In: What action should the robot take to {instruction}?\nOut:"
"""OpenVLA's prompt (docs/design.md §3)."""
PROMPT_CACHE_SIZE = 64
"""Prompts a model keeps tokenised; beyond that the cache starts over (instructions come from the
network, so it must not grow without bound)."""


def prompt_text(instruction: str) -> str:
    """The instruction as it enters the prompt (OpenVLA's normalisation: lower case, no final full stop)."""
    return instruction.strip().lower().rstrip(".")


class TextTokenizer(Protocol):
    bos_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, starting with BOS."""
        ...

    def count(self, text: str) -> int:
        """How many tokens `text` alone becomes (no BOS, nothing appended)."""
        ...


class HashWordTokenizer:
    """Words and punctuation hashed (CRC32) into `n_text_ids` ids after the specials.

    Deterministic across processes and platforms (unlike Python's `hash`), no files, so tiny
    models need nothing from disk. Ids: 0 pad, 1 BOS, 2 EOS, 3.. text.
    """

    bos_id = 1
    _word = re.compile(r"\w+|[^\w\s]")

    def __init__(self, n_text_ids: int) -> None:
        if n_text_ids < 8:
            raise ValueError("n_text_ids must be >= 8")
        self.n_text_ids = n_text_ids

    def encode(self, text: str) -> list[int]:
        words = self._word.findall(text.lower())
        return [self.bos_id] + [3 + zlib.crc32(w.encode()) % self.n_text_ids for w in words]

    def count(self, text: str) -> int:
        return len(self._word.findall(text.lower()))


class HFTokenizer:
    """A `transformers` tokenizer loaded from a local directory (never from a hub)."""

    def __init__(self, directory: str, append_ids: tuple[int, ...] = ()) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        bos = self._tok.bos_token_id
        self.bos_id = int(bos) if bos is not None else 0
        self._append = list(append_ids)

    def encode(self, text: str) -> list[int]:
        ids = list(self._tok(text, add_special_tokens=False)["input_ids"])
        return [self.bos_id] + ids + self._append

    def count(self, text: str) -> int:
        return len(self._tok(text, add_special_tokens=False)["input_ids"])
