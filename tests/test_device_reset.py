"""A firmware reset (the mailbox's Reset Firmware, C008h) in the middle of migrations loses
nothing.

Every migration step (copy, record the new tier, drop the old copy) is provoked with a
write landing before the reset, and the page is compared with what the host wrote; then a
soak: the service's churn migrates pages in steps with the engine's lock released between
them while one client writes (and reports attention, so that the policy migrates too) and
another fires resets.  Every write acknowledged reads back (a shadow copy of the host's
writes is the reference), and the resets are seen to land mid-migration (the device reports
migrations completed and rolled back).
"""

from __future__ import annotations

import random
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cxl import mailbox as mb
from kvcxl.emu.device import service as svc
from kvcxl.emu.device.cci import Mailbox
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.migration import Migrations

PAGE = 4096
CAPACITY = 256 << 20
BASE = 1 << 32
PAGES = 64  # pages written and churned; 16 of them fit in DRAM


def _device(tmp: Path | None = None) -> Type3Device:
    files = {}
    if tmp is not None:
        files = {"dram_file": tmp / "dram.img", "nvme_file": tmp / "nvme.img"}
    dev = Type3Device(CAPACITY, dram_pages=16, **files)
    dev.hdm.program(0, base=BASE, size=CAPACITY)
    dev.hdm.commit(0)
    return dev


def _half_moved(dev: Type3Device, pages: range) -> list[int]:
    """Pages not wholly in the one store their tier map names: a copy in the other store
    too (a migration left half done, a leak) or the bytes in the store the map does not
    name.  Never-written pages are in neither."""
    in_dram = np.frombuffer(dev.in_dram, np.uint8)
    bad = []
    for p in pages:
        where = (p in dev.dram, p in dev.nvme)
        if where != (False, False) and where != (bool(in_dram[p]), not in_dram[p]):
            bad.append(p)
    return bad


@pytest.mark.parametrize("to_dram", [False, True])
@pytest.mark.parametrize("steps", [0, 1])  # reset after the copy / after recording the tier
def test_reset_at_each_step_of_a_migration(to_dram: bool, steps: int) -> None:
    dev = _device()
    mbx = Mailbox(dev)
    p = 5
    dev.move_page(p, to_dram=not to_dram)
    dev.write(BASE + p * PAGE, b"\x11" * PAGE)
    assert dev.start_migration(p, to_dram)
    for _ in range(steps):
        assert not dev.step_migration(p)
    dev.write(BASE + p * PAGE + 100, b"\x22" * 300)  # lands in the middle of the migration
    rc, out = mbx.call(mb.Opcode.VENDOR_RESET, b"")
    assert rc == mb.ReturnCode.SUCCESS
    completed, rolled_back, _moved = struct.unpack("<III", out)
    assert (completed, rolled_back) == ((0, 1) if steps == 0 else (1, 0))
    want = bytearray(b"\x11" * PAGE)
    want[100:400] = b"\x22" * 300
    assert dev.read(BASE + p * PAGE, PAGE).data == bytes(want)
    assert not dev.inflight and dev.check_placement()
    assert _half_moved(dev, range(PAGES)) == []
    assert dev.counters["resets"] == 1


def test_reset_drops_the_firmware_state_and_keeps_the_rest() -> None:
    dev = _device()
    dev.record_victims = True
    mbx = Mailbox(dev)
    for step in range(1, 40):  # 40 pages through 16 DRAM pages: victims, residency
        dev.write(BASE + step * PAGE, bytes([step]) * 64)
        dev.report(step, np.array([step]), np.array([0.5]))
    dev.inject_poison(3 * PAGE)
    mbx.call(mb.Opcode.SET_TIMESTAMP, struct.pack("<Q", 10**18))
    assert dev.victims and dev.cache.stats.as_dict() and dev.time > 0
    assert mbx.call(mb.Opcode.VENDOR_RESET, b"")[0] == mb.ReturnCode.SUCCESS
    # dropped: the policy's metadata (a new session), the victim log, the timestamp
    assert not dev.victims and dev.time == 0 and dev.timestamp_offset_ns is None
    assert int(dev.cache.is_resident(np.arange(dev.n_pages)).sum()) == 0
    assert int(np.frombuffer(dev.in_dram, np.uint8).sum()) == 0  # tiered: all on NVMe
    # kept: the bytes, poison, the decoders, the statistics
    for step in range(1, 40):
        assert dev.read(BASE + step * PAGE, 64).data == bytes([step]) * 64
    assert dev.read(BASE + 3 * PAGE, 64).poisoned
    assert dev.hdm.translate(BASE) == 0 and dev.counters["reports"] == 39
    # and the firmware works again from scratch
    dev.report(1, np.array([7]), np.array([0.5]))
    assert dev.in_dram[7] == 1 and dev.check_placement()


class _Soak:
    """One writer (with attention reports) and one resetter on the service's socket, the
    churn migrating the same pages in steps."""

    def __init__(self, path: Path, seconds: float, seed: int, until=None) -> None:
        self.path, self.seconds, self.rng = path, seconds, random.Random(seed)
        self.until = until  # keep going past ``seconds`` (up to 30 s) until it holds
        self.acted: list | None = None  # a planted defect's: no report once it has acted
        self.shadow = bytearray(PAGES * PAGE)
        self.writes = self.resets = self.completed = self.rolled_back = 0
        self.errors: list[str] = []

    def write(self) -> None:
        with svc.Client(self.path) as c:
            start = time.monotonic()
            step = 1
            while (now := time.monotonic() - start) < self.seconds or (
                self.until is not None and not self.until() and now < 30.0
            ):
                n = self.rng.choice([8, 64, 300, PAGE, 2 * PAGE])
                off = self.rng.randrange(PAGES * PAGE - n)
                data = self.rng.randbytes(n)
                if c.write(BASE + off, data) != 0:
                    self.errors.append(f"write at {off:#x} flagged")
                self.shadow[off : off + n] = data  # acknowledged
                self.writes += 1
                if self.acted:  # a report could migrate the page and heal the defect
                    break
                if self.writes % 4 == 0:
                    pages = np.array(sorted({off // PAGE, self.rng.randrange(PAGES)}))
                    rec = np.zeros(pages.size, mb.ATTENTION_RECORD)
                    rec["entry"], rec["weight"] = pages, 1.0
                    body = struct.pack("<II", step, pages.size) + rec.tobytes()
                    rsp = c.cci(mb.Opcode.VENDOR_ATTENTION_REPORT, body)
                    if rsp.rc != mb.ReturnCode.SUCCESS:
                        self.errors.append(f"attention report: rc {rsp.rc}")
                    step += 1
                if self.writes % 16 == 0:  # a read-back between resets
                    got, _ = c.read(BASE + off, n)
                    if got != bytes(self.shadow[off : off + n]):
                        self.errors.append(f"read-back at {off:#x} differs")

    def reset(self, stop: threading.Event) -> None:
        with svc.Client(self.path) as c:
            while not stop.wait(0.003):
                rsp = c.cci(mb.Opcode.VENDOR_RESET)
                if rsp.rc != mb.ReturnCode.SUCCESS:
                    self.errors.append(f"reset: rc {rsp.rc}")
                    continue
                done, back, _ = struct.unpack("<III", rsp.payload)
                self.resets += 1
                self.completed += done
                self.rolled_back += back


class _Acted(list):
    """Where a planted defect acted.  The moment it does, the churn halts (``halt``, set by
    the soak): a later move of the same page could heal what the defect did before the
    writer's loop next looks (a page rolled back onto the wrong copy, then moved again by
    the churn, ends consistent)."""

    halt: threading.Event | None = None

    def append(self, p: object) -> None:
        super().append(p)
        if self.halt is not None:
            self.halt.set()

    def extend(self, ps: object) -> None:
        super().extend(ps)  # type: ignore[arg-type]
        if self and self.halt is not None:
            self.halt.set()


def _soak(
    tmp: Path, seconds: float = 2.0, seed: int = 0, files: bool = True, acted=None,
    enough: bool = False,
) -> dict:  # fmt: skip
    """Writes, attention reports, churn and resets for ``seconds``.  A planted defect's test
    runs until the defect has acted once (``acted``, at most 30 s) and stops there:
    a slow machine, where few resets land mid-migration, still exercises it, and later
    migrations of the same pages have little time to heal what it did.  ``enough``: go on
    past ``seconds`` (up to 30 s) until the soak has done what the sound test asks of it
    (a loaded machine does less in 2 s)."""
    dev = _device(tmp if files else None)
    engine = svc.Engine(dev)
    churn = svc.Churn(engine, list(range(PAGES)))
    if enough:

        def until() -> bool:
            return (
                soak.writes > 200 and soak.resets > 50 and churn.moves > 50
                and soak.completed > 0 and soak.rolled_back > 0
            )  # fmt: skip

    elif acted is not None:
        acted.halt = churn.halt  # the churn stops as the defect acts: its next move could heal

        def until() -> bool:
            return len(acted) >= 1

    else:
        until = None

    soak = _Soak(tmp / "dev.sock", seconds, seed, until)
    soak.acted = acted
    stop = threading.Event()
    with svc.serving(engine, soak.path):
        churn.start()
        resetter = threading.Thread(target=soak.reset, args=(stop,))
        resetter.start()
        try:
            soak.write()
        finally:
            stop.set()
            resetter.join()
            churn.halt.set()
            churn.join()
        with svc.Client(soak.path) as c:
            c.cci(mb.Opcode.VENDOR_RESET)  # a last one with the churn stopped: all settled
            got, _ = c.read(BASE, PAGES * PAGE)
    wrong = sum(a != b for a, b in zip(got, soak.shadow, strict=True))
    report = {
        "writes": soak.writes,
        "resets": soak.resets,
        "completed": soak.completed,
        "rolled_back": soak.rolled_back,
        "churn_moves": churn.moves,
        "policy_migrations": dev.counters["migrations_to_dram"],
        "wrong_bytes": wrong,
        "errors": soak.errors,
        "internal_errors": dev.counters["internal_errors"],
        "half_moved": _half_moved(dev, range(PAGES)),
    }
    dev.close()
    return report


@pytest.mark.parametrize("files", [True, False], ids=["file-media", "memory-media"])
def test_resets_during_a_churn_soak_lose_nothing(tmp_path: Path, files: bool) -> None:
    r = _soak(tmp_path, files=files, enough=True)
    assert r["wrong_bytes"] == 0 and not r["errors"] and r["internal_errors"] == 0, r
    assert r["half_moved"] == [], r
    assert r["writes"] > 200 and r["resets"] > 50 and r["churn_moves"] > 50, r
    # the resets did land in the middle of migrations, at both kinds of step
    assert r["completed"] > 0 and r["rolled_back"] > 0, r


def _caught(r: dict) -> bool:
    """One of the soak's checks (as the sound test asserts them) fails."""
    return bool(r["wrong_bytes"] or r["errors"] or r["internal_errors"] or r["half_moved"])


def test_the_soak_sees_a_reset_that_rolls_back_the_wrong_copy(tmp_path, monkeypatch) -> None:
    acted = _Acted()

    def wrong_roll_back(self: Migrations, p: int) -> None:
        m = self.inflight.pop(p)
        old = self._ends(m.to_dram)[0]
        # A page coming to DRAM: its only copy is then in DRAM while the map says NVMe,
        # which the reset's realignment (DRAM pages to NVMe) leaves as it is.  (Going the
        # other way, the next move of the page flips the map onto the copy and heals it.)
        if m.to_dram and p in old:
            acted.append(p)
        old.drop(p)  # drops the old copy: the one the map names

    monkeypatch.setattr(Migrations, "_roll_back", wrong_roll_back)
    r = _soak(tmp_path, seconds=0.0, files=False, acted=acted)
    assert _caught(r), r


def test_the_soak_sees_a_write_that_misses_the_copy(tmp_path, monkeypatch) -> None:
    acted = _Acted()
    missed: set[int] = set()  # pages whose copy missed a write, their new tier unrecorded
    real_step, real_roll_back = Migrations.step, Migrations._roll_back

    def no_mirror(self: Migrations, p: int, off: int, data: bytes) -> None:
        m = self.inflight.get(p)
        if m is not None and not m.recorded:  # a write the copy misses
            missed.add(p)

    # The defect has acted once the map names the stale copy: a migration rolled back
    # keeps the old copy, which took the write, and shows nothing.
    def step(self: Migrations, p: int) -> bool:
        done = real_step(self, p)
        if p in missed and not done:
            missed.discard(p)
            acted.append(p)
        return done

    def roll_back(self: Migrations, p: int) -> None:
        missed.discard(p)
        real_roll_back(self, p)

    monkeypatch.setattr(Migrations, "mirror", no_mirror)
    monkeypatch.setattr(Migrations, "step", step)
    monkeypatch.setattr(Migrations, "_roll_back", roll_back)
    r = _soak(tmp_path, seconds=0.0, files=False, acted=acted)
    assert _caught(r), r


def test_the_soak_sees_a_reset_that_forgets_its_migrations(tmp_path, monkeypatch) -> None:
    real = Type3Device.reset

    acted = _Acted()

    def forgetful(self: Type3Device) -> dict:
        # a copy left in DRAM of a page the map puts on NVMe: the reset's realignment
        # (DRAM pages to NVMe) does not heal it
        acted.extend(p for p in self.inflight if p in self.dram and not self.in_dram[p])
        self.inflight.clear()  # neither completed nor rolled back: a copy left behind
        return real(self)

    monkeypatch.setattr(Type3Device, "reset", forgetful)
    r = _soak(tmp_path, seconds=0.0, files=False, acted=acted)
    assert _caught(r) and r["completed"] == r["rolled_back"] == 0, r
