"""The Llama forward pass in torch: KV cache, RoPE, GQA, block attention capture, bounded caches.

One function, :meth:`Llama.forward`, runs a chunk of consecutive tokens against the
KV cache (a chunk of one token is a decode step; a long chunk is a prefill) and
returns the next-token logits of each position plus, per position, the attention
of every (layer, KV head) summed over each ``block_tokens`` block of key positions
and combined over the GQA group by ``max`` or ``mean`` (docs/design.md, "Entries and
attention weights").  Query row ``i`` of a chunk sees exactly what a token-by-token
decode would, so a chunked run and a one-token-at-a-time run record the same trace.

A bounded cache is applied with ``visible``: a boolean ``(layers, kv_heads,
blocks)`` mask of the blocks each KV head may attend to.  Masked keys keep their
original positions (RoPE is applied once, when a key is written), which is how a
paged KV cache behaves when blocks are dropped.  The block a query position
belongs to (the one being written) is always visible to it.

The file's Q and K weights are stored permuted for llama.cpp's adjacent-pair RoPE;
:func:`unpermute_qk` restores the rotate-half layout used here (the original
checkpoint's), which tests check against adjacent-pair RoPE on the raw rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from .gguf_file import GGUFFile
from .tokenizer import Tokenizer
from .weights import gguf_path


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    vocab: int
    rope_base: float
    rms_eps: float
    context_length: int

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> LlamaConfig:
        arch = f.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"general.architecture = {arch!r}: only 'llama' is supported")
        d_model = int(f["llama.embedding_length"])
        n_heads = int(f["llama.attention.head_count"])
        return cls(
            layers=int(f["llama.block_count"]),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=int(f.get("llama.attention.head_count_kv", n_heads)),
            d_head=int(f.get("llama.rope.dimension_count", d_model // n_heads)),
            d_ff=int(f["llama.feed_forward_length"]),
            vocab=int(f.get("llama.vocab_size", len(f["tokenizer.ggml.tokens"]))),
            rope_base=float(f.get("llama.rope.freq_base", 10000.0)),
            rms_eps=float(f["llama.attention.layer_norm_rms_epsilon"]),
            context_length=int(f["llama.context_length"]),
        )


def unpermute_qk(w: NDArray, n_heads: int) -> NDArray:
    """Undo the converter's RoPE permutation of a Q or K weight (rows = output features).

    Per head, the file stores rows in adjacent-pair order (0, d/2, 1, d/2+1, …); the
    rotate-half layout has the two halves contiguous.
    """
    out_dim = w.shape[0]
    d = out_dim // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: NDArray, n_heads: int) -> NDArray:
    """The converter's permutation (rotate-half → adjacent pairs); inverse of unpermute_qk."""
    out_dim = w.shape[0]
    d = out_dim // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class KVCache:
    """Keys (already rotated) and values of every layer, preallocated to ``max_tokens``."""

    def __init__(self, cfg: LlamaConfig, max_tokens: int) -> None:
        shape = (cfg.layers, cfg.n_kv_heads, max_tokens, cfg.d_head)
        self.k = torch.zeros(shape, dtype=torch.float32)
        self.v = torch.zeros(shape, dtype=torch.float32)
        self.length = 0
        self.max_tokens = max_tokens


class Llama:
    """SmolLM2 (Llama architecture) on the CPU in float32."""

    def __init__(self, cfg: LlamaConfig, tensors: dict[str, NDArray]) -> None:
        self.cfg = cfg
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
        self.embed = t["token_embd.weight"]  # (vocab, d_model); tied output head
        self.out_norm = t["output_norm.weight"]
        self.head = t.get("output.weight", self.embed)
        self.layers = []
        for i in range(cfg.layers):
            p = f"blk.{i}."
            q = torch.from_numpy(unpermute_qk(tensors[p + "attn_q.weight"], cfg.n_heads))
            k = torch.from_numpy(unpermute_qk(tensors[p + "attn_k.weight"], cfg.n_kv_heads))
            self.layers.append(
                {
                    "attn_norm": t[p + "attn_norm.weight"],
                    "wqkv": torch.cat([q, k, t[p + "attn_v.weight"]], 0).contiguous(),
                    "wo": t[p + "attn_output.weight"],
                    "ffn_norm": t[p + "ffn_norm.weight"],
                    "wgu": torch.cat([t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]], 0),
                    "wd": t[p + "ffn_down.weight"],
                }
            )
        half = cfg.d_head // 2
        self.inv_freq = 1.0 / (
            cfg.rope_base ** (torch.arange(0, half, dtype=torch.float64) * 2 / cfg.d_head)
        )

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path | None = None, verify: bool = True) -> tuple[Llama, Tokenizer]:
        """Model and tokenizer from a GGUF file (default: the installed, hash-checked one)."""

        g = GGUFFile(path if path is not None else gguf_path(verify=verify))
        cfg = LlamaConfig.from_fields(g.fields)
        tensors = {name: g.tensor(name) for name in g.tensors}
        return cls(cfg, tensors), Tokenizer(g.fields)

    def new_cache(self, max_tokens: int) -> KVCache:
        return KVCache(self.cfg, max_tokens)

    # --- pieces ---------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.cfg.rms_eps) * w

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = pos.to(torch.float64)[:, None] * self.inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().to(torch.float32), ang.sin().to(torch.float32)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    # --- the pass ----------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        tokens: NDArray | list[int],
        cache: KVCache,
        *,
        visible: NDArray | None = None,
        block_tokens: int = 16,
        capture: str | None = "max",
        logits: str = "all",
    ) -> tuple[NDArray, NDArray | None]:
        """Run ``tokens`` at positions ``cache.length …``; returns (logits, block attention).

        logits: (n, vocab) float32.  Block attention (if ``capture`` is "max" or "mean"):
        (n, layers, kv_heads, n_blocks) float32 over the blocks covering the context
        after the chunk; row i's blocks beyond its own position are 0.
        ``visible``: (layers, kv_heads, ≥ n_blocks) bool, the blocks each head may read.
        ``logits="last"`` computes only the last row's logits (a prefill that needs no more).
        """
        cfg = self.cfg
        ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        n = int(ids.numel())
        p0 = cache.length
        end = p0 + n
        if n == 0:
            raise ValueError("forward needs at least one token")
        if end > cache.max_tokens:
            raise ValueError(f"context of {end} tokens exceeds the cache's {cache.max_tokens}")
        if logits not in ("all", "last"):
            raise ValueError(f"logits = {logits!r}: must be 'all' or 'last'")
        if capture not in (None, "max", "mean"):
            raise ValueError(f"capture = {capture!r}: must be 'max', 'mean' or None")
        nb = -(-end // block_tokens)
        pos = torch.arange(p0, end)
        cos, sin = self._rope(pos)
        keys = torch.arange(end)
        # Additive mask (n, end) per (layer, kv head): causal, plus the bounded cache.
        allowed = keys[None, :] <= pos[:, None]  # (n, end)
        if visible is not None:
            vis = torch.as_tensor(np.asarray(visible, dtype=bool)[:, :, :nb])
            if tuple(vis.shape) != (cfg.layers, cfg.n_kv_heads, nb):
                raise ValueError(
                    f"visible has shape {tuple(np.shape(visible))}: must be "
                    f"({cfg.layers}, {cfg.n_kv_heads}, >= {nb})"
                )
            key_vis = vis.repeat_interleave(block_tokens, dim=2)[:, :, :end]  # (L, H, end)
            own = (keys[None, :] // block_tokens) == (pos[:, None] // block_tokens)  # (n, end)
            allowed_lh = allowed[None, None] & (key_vis[:, :, None, :] | own[None, None])
            bias_all = torch.zeros(allowed_lh.shape, dtype=torch.float32)
            bias_all.masked_fill_(~allowed_lh, float("-inf"))
            bias_all = bias_all[:, :, None]  # (L, H, 1, n, end): broadcast over the group
        else:
            bias = torch.zeros((n, end), dtype=torch.float32).masked_fill_(~allowed, float("-inf"))
        G, H, D = cfg.group, cfg.n_kv_heads, cfg.d_head
        scale = 1.0 / math.sqrt(D)
        captured = torch.zeros((cfg.layers, H, n, nb), dtype=torch.float32) if capture else None
        pad = nb * block_tokens - end
        x = self.embed[ids]  # (n, d)
        for li, lw in enumerate(self.layers):
            h = self._rms(x, lw["attn_norm"])
            qkv = h @ lw["wqkv"].T
            q = qkv[:, : cfg.n_heads * D].view(n, H, G, D).permute(1, 2, 0, 3)  # (H, G, n, D)
            k = qkv[:, cfg.n_heads * D : (cfg.n_heads + H) * D].view(n, H, D).transpose(0, 1)
            v = qkv[:, (cfg.n_heads + H) * D :].view(n, H, D).transpose(0, 1)
            q = self._rotate(q, cos, sin)
            cache.k[li, :, p0:end] = self._rotate(k, cos, sin)
            cache.v[li, :, p0:end] = v
            kk = cache.k[li, :, :end]  # (H, end, D)
            scores = (q @ kk[:, None].transpose(-1, -2)) * scale  # (H, G, n, end)
            scores = scores + (bias_all[li] if visible is not None else bias)
            probs = torch.softmax(scores, dim=-1)
            if captured is not None:
                blocks = torch.nn.functional.pad(probs, (0, pad)).view(H, G, n, nb, block_tokens)
                # A block's share of one softmax is at most 1 (the weight's contract, [0, 1]);
                # a float32 sum over a block holding nearly all of it can land an ulp above.
                per_head = blocks.sum(-1).clamp_(max=1.0)  # (H, G, n, nb)
                captured[li] = per_head.amax(1) if capture == "max" else per_head.mean(1)
            att = probs @ cache.v[li, :, :end][:, None]  # (H, G, n, D)
            att = att.permute(2, 0, 1, 3).reshape(n, cfg.n_heads * D)
            x = x + att @ lw["wo"].T
            h = self._rms(x, lw["ffn_norm"])
            gu = h @ lw["wgu"].T
            g, u = gu[:, : cfg.d_ff], gu[:, cfg.d_ff :]
            x = x + (torch.nn.functional.silu(g) * u) @ lw["wd"].T
        cache.length = end
        if logits == "last":
            x = x[-1:]
        out = self._rms(x, self.out_norm) @ self.head.T
        block_att = captured.permute(2, 0, 1, 3).numpy() if captured is not None else None
        return out.numpy(), block_att
