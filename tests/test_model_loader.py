"""The model loader: GGUF parsing and dequantization, RoPE layout, tokenizer, forward pass."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvcxl.model.gguf_file import GGUFError, GGUFFile, dequantize
from kvcxl.model.llama import permute_qk, unpermute_qk


def _rope_pairs(x: np.ndarray, pos: int, base: float) -> np.ndarray:
    """llama.cpp's adjacent-pair RoPE on one head vector."""
    d = x.size
    out = x.copy()
    for i in range(d // 2):
        th = pos * base ** (-2 * i / d)
        a, b = x[2 * i], x[2 * i + 1]
        out[2 * i], out[2 * i + 1] = (
            a * np.cos(th) - b * np.sin(th),
            a * np.sin(th) + b * np.cos(th),
        )
    return out


def _rope_half(x: np.ndarray, pos: int, base: float) -> np.ndarray:
    """Rotate-half RoPE (the original checkpoint's layout) on one head vector."""
    d = x.size
    th = pos * base ** (-2 * np.arange(d // 2) / d)
    c, s = np.cos(np.concatenate([th, th])), np.sin(np.concatenate([th, th]))
    rot = np.concatenate([-x[d // 2 :], x[: d // 2]])
    return x * c + rot * s


def test_permutation_round_trip() -> None:
    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(32, 3)
    assert np.array_equal(unpermute_qk(permute_qk(w, 4), 4), w)
    assert not np.array_equal(unpermute_qk(w, 4), w)


def test_unpermuted_rotate_half_equals_file_layout_adjacent_pairs() -> None:
    """q·k after RoPE is the same either way: the file's rows with adjacent pairs,
    or the unpermuted rows with rotate-half."""
    rng = np.random.default_rng(1)
    d, heads, d_in = 8, 2, 5
    wq_file = rng.normal(size=(heads * d, d_in))
    wk_file = rng.normal(size=(heads * d, d_in))
    h1, h2 = rng.normal(size=d_in), rng.normal(size=d_in)
    for head in range(heads):
        sl = slice(head * d, (head + 1) * d)
        q_f, k_f = (wq_file @ h1)[sl], (wk_file @ h2)[sl]
        q_h, k_h = (unpermute_qk(wq_file, heads) @ h1)[sl], (unpermute_qk(wk_file, heads) @ h2)[sl]
        a = _rope_pairs(q_f, 7, 1e4) @ _rope_pairs(k_f, 3, 1e4)
        b = _rope_half(q_h, 7, 1e4) @ _rope_half(k_h, 3, 1e4)
        assert a == pytest.approx(b, rel=1e-12)


def test_dequantize_q4_1_reference() -> None:
    """One Q4_1 block by ggml's formula x = d·q + m; low nibbles first, high nibbles next."""
    d, m = np.float16(0.5), np.float16(-1.0)
    qs = bytes((i % 16) | ((15 - i % 16) << 4) for i in range(16))
    raw = np.frombuffer(d.tobytes() + m.tobytes() + qs, dtype=np.uint8)
    x = dequantize(raw, 3, (32,))
    q = [i % 16 for i in range(16)] + [15 - i % 16 for i in range(16)]
    assert np.array_equal(x, 0.5 * np.array(q, dtype=np.float32) - 1.0)


def test_dequantize_q8_0_reference() -> None:
    d = np.float16(0.25)
    q = np.arange(-16, 16, dtype=np.int8)
    raw = np.frombuffer(d.tobytes() + q.tobytes(), dtype=np.uint8)
    assert np.array_equal(dequantize(raw, 8, (32,)), 0.25 * q.astype(np.float32))


def test_unsupported_type_refused() -> None:
    with pytest.raises(GGUFError, match="type 12"):
        dequantize(np.zeros(144, dtype=np.uint8), 12, (256,))


def test_not_a_gguf_file(tmp_path) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(p)
    q = tmp_path / "y.gguf"
    q.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 100))
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(q)
    r = tmp_path / "z.gguf"
    r.write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    with pytest.raises(GGUFError, match="version 9"):
        GGUFFile(r)


# --- the real model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    from kvcxl.model.capture import shared_model

    return shared_model(1)


@pytest.mark.slow
@pytest.mark.model
def test_file_verified_and_hparams(model) -> None:
    m, tok = model
    c = m.cfg
    assert (c.layers, c.n_heads, c.n_kv_heads, c.d_head, c.vocab) == (30, 9, 3, 64, 49152)
    assert c.rope_base == 1e5
    assert tok.vocab_size == 49152


@pytest.mark.slow
@pytest.mark.model
def test_dequantization_matches_gguf_package(model) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as ref

    from kvcxl.model.weights import gguf_path

    g = GGUFFile(gguf_path(verify=False))
    for name in ("token_embd.weight", "blk.3.attn_q.weight", "blk.29.ffn_down.weight"):
        info = g.tensors[name]
        mine = g.tensor(name)
        theirs = ref(
            np.asarray(g.raw(name)).reshape(info.shape[0], -1), GGMLQuantizationType(info.ggml_type)
        )
        assert np.array_equal(mine, theirs.reshape(info.shape)), name


@pytest.mark.slow
@pytest.mark.model
def test_tokenizer_round_trip_and_specials(model) -> None:
    from kvcxl.model.tokenizer import Message, Tokenizer

    _, tok = model
    text = Tokenizer.chat([Message("user", "Count: 12345, naïve café — 'quoted' text!")])
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids[0] == tok.encode("<|im_start|>")[0] == 1  # a control token is one id
    assert tok.encode("2024") == [tok.encode(c)[0] for c in "2024"]  # digits split one by one
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


@pytest.mark.slow
@pytest.mark.model
def test_fixed_prompt_gives_expected_first_tokens(model) -> None:
    """Greedy decoding of a factual question: the trained model's known answer."""
    from kvcxl.model.capture import capture
    from kvcxl.model.tokenizer import Message, Tokenizer

    m, tok = model
    ids = tok.encode(Tokenizer.chat([Message("user", "What is the capital of France?")]))
    cap = capture(m, ids, 8, stop_at_eos=tok.im_end_id)
    out = cap.tokens[len(ids) :]
    assert tok.decode(out) == "The capital of France is Paris.<|im_end|>"
    assert out == [504, 3575, 282, 4649, 314, 7042, 30, 2]


@pytest.mark.slow
@pytest.mark.model
def test_chunked_pass_equals_token_by_token(model) -> None:
    m, tok = model
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 3)[:40]
    c1 = m.new_cache(64)
    lg1, a1 = m.forward(ids, c1, block_tokens=8)
    c2 = m.new_cache(64)
    rows = [m.forward([t], c2, block_tokens=8) for t in ids]
    lg2 = np.concatenate([r[0] for r in rows])
    assert np.abs(lg1 - lg2).max() < 1e-3
    for i, (_, a) in enumerate(rows):
        nb = a.shape[-1]
        assert np.abs(a1[i, :, :, :nb] - a[0]).max() < 1e-5
        assert np.all(a1[i, :, :, nb:] == 0)
    # Each query head's weights sum to 1, so the max over a group sums to >= 1.
    assert np.all(a1.sum(-1) >= 1 - 1e-4)
    assert np.all(a1.sum(-1) <= m.cfg.group + 1e-4)


@pytest.mark.slow
@pytest.mark.model
def test_visible_mask_all_true_is_bitwise_unbounded(model) -> None:
    m, tok = model
    ids = tok.encode("Attention sinks keep softmax mass somewhere. " * 4)[:48]
    c1, c2 = m.new_cache(64), m.new_cache(64)
    vis = np.ones((30, 3, 3), dtype=bool)
    for s in range(0, 48, 16):
        a = m.forward(ids[s : s + 16], c1, block_tokens=16)
        b = m.forward(ids[s : s + 16], c2, block_tokens=16, visible=vis)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    # Hiding block 0 from every head changes the next-token distribution.
    c3 = m.new_cache(64)
    m.forward(ids[:32], c3, block_tokens=16)
    vis[:, :, 0] = False
    hidden = m.forward(ids[32:48], c3, block_tokens=16, visible=vis)
    assert np.abs(hidden[0] - a[0]).max() > 0.1
    assert np.all(hidden[1][:, :, :, 0] == 0)
