"""Text <-> token ids for a loaded model: byte-level BPE via `tokenizers`, the chat template,
and incremental detokenization for streaming.

Invariant: streamed text never ends in the middle of a UTF-8 character; the concatenation of
all deltas equals decoding all tokens at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from backend.model.chat_template import ChatTemplate
from backend.model.errors import ModelLoadError

_CONTROL, _USER_DEFINED = 3, 4
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's stand-in character -> the byte it stands for: printable Latin-1
    characters stand for themselves, the other bytes for U+0100 onwards, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + i): b for i, b in enumerate(shifted)}


_BYTE_OF = _byte_alphabet()


class Tokenizer:
    def __init__(
        self,
        inner: HFTokenizer,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        chat_template: str | None,
    ) -> None:
        self.inner = inner
        self._plain: HFTokenizer | None = None
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        bos = inner.id_to_token(bos_id) if bos_id is not None else None
        eos = inner.id_to_token(eos_ids[0]) if eos_ids else None
        self.chat_template = ChatTemplate(chat_template, bos or "", eos or "")
        self._added = frozenset(inner.get_added_tokens_decoder())
        self._bytes: dict[int, bytes] = {}

    @classmethod
    def from_gguf_vocab(
        cls,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int],
        pre: str,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        chat_template: str | None,
    ) -> Tokenizer:
        """A byte-level (gpt2-style) BPE from the vocabulary and merges stored in a GGUF."""
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        inner = HFTokenizer(models.BPE(vocab, pairs, fuse_unk=False))  # type: ignore[arg-type]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre != "llama-bpe")
        if pre == "llama-bpe":
            split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
            inner.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
        elif pre in ("smollm", "starcoder", "refact"):
            digits = pre_tokenizers.Digits(individual_digits=True)
            inner.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
        else:
            inner.pre_tokenizer = byte_level
        inner.decoder = decoders.ByteLevel()
        special = [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, token_type in enumerate(token_types)
            if token_type in (_CONTROL, _USER_DEFINED)
        ]
        inner.add_special_tokens(special)
        return cls(inner, bos_id, eos_ids, chat_template)

    @classmethod
    def from_hf_dir(
        cls, path: Path, bos_id: int | None, eos_ids: tuple[int, ...], chat_template: str | None
    ) -> Tokenizer:
        try:
            inner = HFTokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises bare Exception subclasses
            raise ModelLoadError(
                f"{path / 'tokenizer.json'}: cannot read tokenizer: {exc}"
            ) from exc
        return cls(inner, bos_id, eos_ids, chat_template)

    @property
    def vocab_size(self) -> int:
        return int(self.inner.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids of text. With parse_special, special-token strings in text (such as
        "<|im_end|>") map to their ids, as a rendered chat template needs; without it they are
        plain text, so untrusted text cannot forge a role boundary."""
        if parse_special:
            return list(self.inner.encode(text, add_special_tokens=False).ids)
        if self._plain is None:
            self._plain = HFTokenizer.from_str(self.inner.to_str())
            self._plain.encode_special_tokens = True
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (an added token: its text), for logprobs' `bytes`."""
        cached = self._bytes.get(token_id)
        if cached is not None:
            return cached
        piece = self.inner.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is outside the vocabulary")
        if token_id in self._added or any(c not in _BYTE_OF for c in piece):
            raw = piece.encode() if token_id in self._added else self.decode([token_id]).encode()
        else:
            raw = bytes(_BYTE_OF[c] for c in piece)  # byte-level BPE: one character per byte
        self._bytes[token_id] = raw
        return raw

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.chat_template.render(messages, add_generation_prompt)

    def incremental(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)

    def to_json(self) -> str:
        """The tokenizer.json text of this tokenizer."""
        return str(self.inner.to_str())


class IncrementalDecoder:
    """Turns a stream of token ids into text deltas, holding back incomplete characters."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # decoding starts here, so merges across the boundary stay right
        self._read = 0  # text of ids[prefix:read] has already been emitted

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self._ids.append(token_id)
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]
