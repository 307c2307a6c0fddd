"""The model's byte-level BPE tokenizer, built from the vocabulary and merges in the GGUF file.

SmolLM2 uses a GPT-2-style byte-level BPE (``tokenizer.ggml.model = gpt2``) with the
``smollm`` pre-tokenizer: every digit is its own piece, then GPT-2's regex split.
Control tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, …) are matched
whole before BPE.  The chat format is ChatML, as the file's template says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONTROL = 3  # tokenizer.ggml.token_type value of control tokens
# What the file's chat template inserts when a conversation has no system message.
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass(frozen=True)
class Message:
    role: str
    content: str


class Tokenizer:
    """Encode text to ids and decode back, exactly as the model was trained."""

    def __init__(self, fields: dict[str, Any]) -> None:
        # lazy: tokenizers is the optional 'model' extra (`kvcxl --help` imports this module)
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"tokenizer.ggml.model = {kind!r}: only byte-level BPE 'gpt2' is supported"
            )
        tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
        types = list(fields.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        specials = [tokens[i] for i, t in enumerate(types) if int(t) == CONTROL]
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        self._tok = tok
        self.vocab_size = len(tokens)
        self.tokens = tokens
        self.bos_id = int(fields.get("tokenizer.ggml.bos_token_id", 1))
        self.eos_id = int(fields.get("tokenizer.ggml.eos_token_id", 2))
        self.special_ids = frozenset(vocab[s] for s in specials)
        self.im_end_id = vocab.get("<|im_end|>", self.eos_id)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def piece(self, token_id: int) -> str:
        """One token as text (for per-step reports)."""
        return self.decode([token_id])

    @staticmethod
    def chat(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """ChatML text of a conversation, as the file's chat template renders it."""
        messages = list(messages)
        if not messages or messages[0].role != "system":
            messages.insert(0, Message("system", DEFAULT_SYSTEM))
        parts = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)
