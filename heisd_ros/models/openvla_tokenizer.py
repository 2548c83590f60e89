"""OpenVLA's prompt tokenizer (the checkpoint's LLaMA-2 tokenizer), and a LLaMA-2-like one for
checkpoints made with random weights (docs/design.md §3).

The checkpoint's `tokenizer.json` is read with the `tokenizers` library: no transformers tokenizer
class and nothing the checkpoint names in `auto_map` is involved. Prompt ids are BOS, the text,
and the empty token 29871 unless the text already ends with it (OpenVLA's `predict_action`
appends it, as its training inputs had it after "Out:").
"""

from __future__ import annotations

import json
from pathlib import Path

from heisd_ros.core.errors import ModelLoadError
from heisd_ros.core.files import read_capped_text, read_json

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
EMPTY_TOKEN_ID = 29871
"""The LLaMA-2 tokenizer's empty piece '▁', which OpenVLA appends after the prompt."""
LLAMA2_VOCAB = 32000
SPACE = "\u2581"
PAD_TOKEN = "<PAD>"
SPECIALS = ("<unk>", "<s>", "</s>")


def _token_name(value, default: str) -> str:
    """A special token of tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else default


class LlamaPromptTokenizer:
    """The checkpoint's tokenizer.json; implements `heisd_ros.models.text_tokenizer.TextTokenizer`."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise ModelLoadError(f"{directory} has no {TOKENIZER_FILE} (every published OpenVLA checkpoint ships "
                                 "one; a tokenizer.model alone is not read)")
        try:
            self._tok = Tokenizer.from_str(read_capped_text(path, ModelLoadError))
        except Exception as err:
            raise ModelLoadError(f"corrupt {path}: {err}") from err
        bos = "<s>"
        config = directory / TOKENIZER_CONFIG
        if config.is_file():
            try:
                bos = _token_name(read_json(config, ModelLoadError).get("bos_token"), bos)
            except (OSError, json.JSONDecodeError, AttributeError) as err:
                raise ModelLoadError(f"corrupt {config}: {err}") from err
        bos_id = self._tok.token_to_id(bos)
        if bos_id is None:
            raise ModelLoadError(f"{path}: no BOS token {bos!r}")
        if self._tok.id_to_token(EMPTY_TOKEN_ID) is None:
            raise ModelLoadError(f"{path}: no token {EMPTY_TOKEN_ID} (OpenVLA's empty token); not a LLaMA-2 vocabulary")
        self.bos_id = int(bos_id)

    def _ids(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        """BOS + the text's ids + the empty token (unless the text's ids already end with it)."""
        ids = self._ids(text)
        return [self.bos_id] + ids + ([] if ids and ids[-1] == EMPTY_TOKEN_ID else [EMPTY_TOKEN_ID])

    def count(self, text: str) -> int:
        return len(self._ids(text))


DEFAULT_WORDS = (
    "in what action should the robot take to out pick up put place push pull open close turn on off "
    "red blue green yellow black white bowl plate block cup mug drawer cabinet stove basket box top of "
    "left right front back and it into onto from with a"
)


def _pieces(words: tuple[str, ...]) -> tuple[list[str], list[tuple[str, str]]]:
    """Pieces and BPE merges that spell each word, with its leading '▁', left to right."""
    pieces: list[str] = []
    merges: list[tuple[str, str]] = []
    for word in words:
        piece = SPACE
        for ch in word:
            if piece + ch not in pieces:
                merges.append((piece, ch))
                pieces.append(piece + ch)
            piece += ch
    return pieces, merges


def build_llama_like_tokenizer(words: tuple[str, ...] = tuple(DEFAULT_WORDS.split())):
    """A `tokenizers.Tokenizer` shaped like LLaMA-2's: ids 0-2 <unk> <s> </s>, 3-258 byte
    fallbacks, printable characters, '▁word' pieces for `words` (and their prefixes), '▁' at
    id 29871, filler pieces up to 32000 ids (so the action ids 31744-31999 exist), <PAD> = 32000;
    SentencePiece-style normalisation (a leading '▁', spaces as '▁') and a BOS template."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        processors,
    )

    chars = [chr(c) for c in range(33, 127)]
    word_pieces, merges = _pieces(tuple(w.lower() for w in words) + tuple(w.capitalize() for w in words))
    ordered = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)] + chars + word_pieces
    if len(ordered) >= EMPTY_TOKEN_ID:
        raise ValueError("too many words for a LLaMA-2-sized vocabulary")
    vocab = {piece: i for i, piece in enumerate(ordered)}
    for i in range(len(ordered), LLAMA2_VOCAB):
        vocab[SPACE if i == EMPTY_TOKEN_ID else f"<filler_{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_special_tokens([AddedToken(PAD_TOKEN, special=True, normalized=False)])
    return tok


def write_tokenizer_files(directory: Path, tokenizer) -> None:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json, added_tokens.json as an
    OpenVLA checkpoint has them. BPE merges are written as "a b" strings, as published
    tokenizer.json files have them (tokenizers < 0.20, which OpenVLA's own code pins, reads no other form)."""
    data = json.loads(tokenizer.to_str())
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    (directory / TOKENIZER_FILE).write_text(json.dumps(data, ensure_ascii=False, indent=2))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": PAD_TOKEN}
    config = dict(specials, add_bos_token=True, add_eos_token=False, model_max_length=2048, padding_side="right",
                  tokenizer_class="LlamaTokenizer", legacy=False, clean_up_tokenization_spaces=False)
    (directory / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2))
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    (directory / "added_tokens.json").write_text(json.dumps({PAD_TOKEN: LLAMA2_VOCAB}, indent=2))
