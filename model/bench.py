"""``kvcxl bench`` figures of the real-model part: load time, capture throughput, peak memory.

All Measured on this machine with one torch thread (steady timings).  Wall-clock
rates suffer when other processes share the cores; the CPU-time rate does not.  Peak memory is
the process's peak resident set (``ru_maxrss``), read after the run: it includes
the loaded weights (float32, ~540 MB) and whatever else the bench process holds.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

from .capture import capture, load_model, load_prompt
from .quality import PolicySpec, run


def _capture_bench(quick: bool) -> dict:
    import torch  # lazy: the 'model' extra; `kvcxl bench` imports this module without it

    t0 = time.perf_counter()
    model, tok = load_model(1)
    load_s = time.perf_counter() - t0
    torch.set_num_threads(1)
    prompt = load_prompt("long-doc", tok)
    if quick:
        prompt, steps = prompt[:96], 4
    else:
        steps = 32
    c0 = time.process_time()
    cap = capture(model, prompt, steps)
    cpu_s = time.process_time() - c0
    prefill_s = cap.info["prefill_seconds"]
    decode_s = cap.seconds - prefill_s
    seq = cap.tokens
    t0 = time.perf_counter()
    ref, _ = run(model, seq, policy=None, budget_tokens=None)
    run(model, seq, policy=PolicySpec.parse("sink-window"), budget_tokens=64, reference=ref)
    bounded_s = time.perf_counter() - t0
    return {
        "evidence": "Measured",
        "torch_threads": 1,
        "model_load_s": round(load_s, 3),
        "prompt_tokens": len(prompt),
        "generated_tokens": steps,
        "capture_s": round(cap.seconds, 3),
        "capture_tokens_per_s": round(len(seq) / cap.seconds, 2),
        "capture_cpu_s": round(cpu_s, 3),
        "capture_tokens_per_cpu_s": round(len(seq) / cpu_s, 2),
        "prefill_with_capture_tokens_per_s": round(len(prompt) / prefill_s, 2),
        "decode_with_capture_tokens_per_s": round(steps / max(decode_s, 1e-9), 2),
        "quality_reference_plus_bounded_run_tokens_per_s": round(2 * len(seq) / bounded_s, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def benches() -> dict[str, Callable[[bool], dict]]:
    return {"model.capture": _capture_bench}
