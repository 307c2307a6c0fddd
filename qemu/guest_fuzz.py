"""Fuzzing the command ring from inside a booted guest.

The host draws mutated ring commands and the return code the ring's model predicts for
each (:class:`kvcxl.qemu.ring_fuzz.CaseMaker`, the in-process fuzzer's generator) and
writes the commands into the fuzz area of the device's memory before the boot
(:func:`image`).  The guest agent's ``fuzz`` job submits them one at a time through the
ring from inside the guest (guest stores through QEMU's CXL memory path, a real doorbell)
and writes back, per case, the completion's status and ``out_len`` and the bytes it found
changed where the command may not write (the other completions, the queues, its output
slot past ``out_len``; a pattern in KV space once at the end).  :func:`check` compares
them with the predictions.  The model follows the ring's rules (docs/qemu.md, "The ring")
for the firmware the boot runs: the memory-path device (patched QEMU), the device emulator
or the ring-only session (stock QEMU).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from kvcxl.cxl import ring as L

from .ring_fuzz import FIRMWARES, CaseMaker

CASES_MAX = 2000  # what the fuzz area holds (payloads average about 750 B; checked in image)


def image(
    cases: int, seed: int, media_size: int, firmware: str = "ring-only"
) -> tuple[bytes, dict]:
    """The fuzz area's bytes for ``cases`` mutated commands, and the expectations
    (``want``: return codes, ``ops``, ``mutations``) :func:`check` compares with; the
    model predicts the answers of ``firmware`` (one of ``ring_fuzz.FIRMWARES``)."""
    if not 1 <= cases <= CASES_MAX:
        raise ValueError(f"fuzz cases = {cases}: must be 1 … {CASES_MAX}")
    if firmware not in FIRMWARES:
        raise ValueError(f"firmware = {firmware!r}: one of {', '.join(FIRMWARES)}")
    maker = CaseMaker(media_size, seed, firmware)
    rows = np.zeros(cases, L.FUZZ_CASE)
    payloads = bytearray()
    hdr = L.FUZZ_HDR_FMT.size
    first_payload = hdr + cases * L.FUZZ_CASE.itemsize
    want, ops, how = [], [], []
    for k in range(cases):
        (op, step, count, payload, a0, a1, in_len), mutation, code = maker.next()
        body = payload[: min(in_len, L.SLOT_IN)]
        rows[k] = (op, 0, step, count, in_len, a0, a1, first_payload + len(payloads), len(body))
        payloads += body
        payloads += bytes(-len(payloads) % 8)
        want.append(code)
        ops.append(op)
        how.append(mutation)
    results = first_payload + len(payloads)
    size = results + cases * L.FUZZ_RESULT.itemsize
    if size > L.FUZZ_SIZE:
        raise ValueError(f"{cases} fuzz cases need {size} B, more than the {L.FUZZ_SIZE} B area")
    head = L.FUZZ_HDR_FMT.pack(L.FUZZ_MAGIC, cases, hdr, results)
    # The results start zeroed (done = 0): a case the guest never reached reads as not done.
    img = head + rows.tobytes() + bytes(payloads) + bytes(cases * L.FUZZ_RESULT.itemsize)
    return img, {
        "want": want, "ops": ops, "mutations": how, "results": results, "firmware": firmware,
    }  # fmt: skip


def results_span(expect: dict) -> tuple[int, int]:
    """(DPA, bytes) of the results the guest writes back."""
    return L.FUZZ_BASE + expect["results"], len(expect["want"]) * L.FUZZ_RESULT.itemsize


def check(results: bytes, expect: dict) -> dict:
    """Compare the guest's results (read back from :func:`results_span`) with the
    model's predictions.  A crash is an Internal Error completion or a case the guest
    never completed; a wrong return code any other difference."""
    want = expect["want"]
    n = len(want)
    res = np.frombuffer(results, L.FUZZ_RESULT, count=n)
    coverage: Counter[str] = Counter()
    crashes = wrong = not_done = 0
    examples: list[str] = []
    for k in range(n):
        op = expect["ops"][k]
        name = L.OPCODES.get(op, "unknown")
        if not res["done"][k]:
            not_done += 1
            continue
        got = int(res["status"][k])
        coverage[f"{name} -> {L.RC_NAMES.get(got, hex(got))}"] += 1
        if got == L.RC_INTERNAL:
            crashes += 1
        elif got != want[k]:
            wrong += 1
            if len(examples) < 10:
                examples.append(
                    f"case {k}: {name} ({expect['mutations'][k]}): got "
                    f"{L.RC_NAMES.get(got, hex(got))}, want {L.RC_NAMES.get(want[k])}"
                )
    return {
        "interface": "the command ring, driven from inside the guest",
        "firmware": expect.get("firmware", "ring-only"),
        "cases": n,
        "unmodified_cases": 0,
        "completed": n - not_done,
        "crashes": crashes + not_done,
        "wrong_return_codes": wrong,
        "changed_bytes": int(res["stray"].sum()),
        "mutations": dict(Counter(expect["mutations"])),
        "coverage": dict(sorted(coverage.items())),
        "examples": examples,
        "evidence": "Measured",
    }
