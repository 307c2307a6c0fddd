"""Boot the virtual host: the device, then QEMU with a CXL Type-3 device whose media is
a shared file the device maps; collect what both sides report.

With the patched QEMU (``qemu="kvcxl"``, the default) one process is the device: the
memory-path device QEMU forwards to also answers the ring, on its doorbell
(``python -m kvcxl.qemu.ring_device``).  With stock QEMU the ring is polled by the
firmware service, whose firmware is the device emulator
(:class:`kvcxl.emu.device.device.Type3Device`) in its process
(``python -m kvcxl.qemu.service --device``); ``device_emulator=False`` runs the
service's own firmware session instead (ring-only mode).

One :class:`Boot` is one run.  Everything it starts (service, QEMU) is in its own
process group and is killed on the way out, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import ring as L
from kvcxl.emu.device.service import Client

from . import guest_fuzz, ring_fuzz
from .accel import KVM_INTERNAL_ERROR, accel_unusable
from .qmp import Qmp
from .setup import SetupError, load_host
from .trace_image import default_trace, encode

DEVICE_ID = "cxl-vmem0"
MARK = "@kvcxl "
# The event that carries a job's result where it is not the job's own name (/init's jobs).
JOB_EVENT = {"poison": "poison_list", "wait": "waiting"}
# The guest's words for a failure: /init's failed step, an agent that exited non-zero, the
# agent's own refusal, the ring's device error (no heartbeat, a fault).
FAILURE_EVENTS = ("fail", "agent_failed", "agent_error", "device_error")
# The host's: the boot's timeout, the stall watchdog, QEMU's KVM error, a killed peer.
HOST_FAILURE_EVENTS = ("host_timeout", "host_stall", "kvm_internal_error", "host_inject_failed",
                       "hook_failed", "host_killed_service", "host_killed_device")  # fmt: skip
CONSOLE_TAIL = 40  # console lines a report keeps when the guest or a job did not finish
OWNER_ONLY = 0o077  # umask of the service and QEMU: their sockets and files are the owner's


@dataclass
class BootOptions:
    jobs: tuple[str, ...] = ("datapath", "replay")
    trace: Any = None  # GuestTrace; None: the built-in default trace
    device_mib: int = 256
    plugin: bool | None = None  # None: use it when it was built
    smp: int = 2
    timeout: float = 400.0
    policy: str = "ema"
    mode: str = "float"  # the firmware's EMA arithmetic: float, or int (Q0.16, the RTL's)
    config: str | None = None  # policy TOML
    poison: tuple[tuple[int, int], ...] = ()  # (dpa, length) injected before the guest probes
    media_events: tuple[int, ...] = ()  # dpa of General Media events injected at region ready
    workdir: str | None = None
    keep: bool = False
    wait_s: float = 0.0  # the "wait" job's sleep
    fuzz_cases: int = 500  # the "fuzz" job's mutated ring commands (qemu/guest_fuzz.py)
    fuzz_seed: int = 0
    device_emulator: bool = True  # the ring's firmware is the device emulator (--device)
    # "kvcxl": the patched QEMU with the kvcxl device on the memory path; "stock": Debian's
    qemu: str = "kvcxl"
    # Pages (dpa, length) the kvcxl device keeps trapped: every guest access to them is a
    # CXL.mem request to the device (the slow path), even where QEMU could go direct.
    trap: tuple[tuple[int, int], ...] = ()
    # (--qemu kvcxl) pages the device moves to NVMe and back while the guest runs
    churn: tuple[tuple[int, int], ...] = ()
    # (--qemu kvcxl) DIRECT pages mapped into the guest as RAM (QEMU's kvcxl-alias=on): the
    # guest reaches them at RAM speed, but its accesses to them are no longer counted per
    # page, so the firmware's learned reads miss them (docs/qemu.md, "DIRECT pages as RAM")
    alias: bool = False
    # (--qemu kvcxl) how QEMU sends CXL.mem requests to the device: "ring", the shared-
    # memory request ring (kvcxl-ring=, qemu/memring.py), or "socket", the device's socket
    # (the mailbox always takes the socket)
    mem_link: str = "ring"
    # (--alias) share of the KV cache's DIRECT pages the device traps each step to learn
    # the reads from their first touches (emu/device/sampling.py); 0: off
    sample_rate: float = 0.0
    # the guest's accelerator: "tcg", or "kvm" where /dev/kvm is usable (docs/qemu.md, "KVM")
    accel: str = "tcg"
    # (--qemu kvcxl) what the device's Get Health Info says, e.g. (("life_used", 7),)
    health: tuple[tuple[str, int], ...] = ()
    on_event: Callable[[dict, Boot], None] | None = None
    console: Callable[[str], None] | None = None  # every console line, as it arrives
    # A guest silent this long (the 'wait' job's sleep added) has stalled: QEMU is stopped.
    # (A long job prints its progress every 10 s, so silence is a stall, not a slow job.)
    stall_s: float = 120.0
    # The guest's own budgets, set for a loaded 2-core machine, where a Python device can be
    # off its core for seconds and Linux's probing under TCG is slow: the firmware silent
    # (no heartbeat, ring not ready, plugin not armed) this long is a device error; a
    # probing step (memdev, decoders, region, DAX) not done in probe_s is /init's failure.
    # The longest heartbeat gap the agent saw is in its results (heartbeat_gap_max_ms).
    heartbeat_s: float = 30.0
    probe_s: int = 60
    # Boots retried when the guest stalls, or QEMU ends on a signal, before the kvcxl agent
    # starts, i.e. in Linux's boot, driver probing or region set-up under TCG (QEMU's and
    # Linux's code, not ours); each retry is reported in "boot_retries".  A stall or a
    # crash after the agent started is a result.
    retries: int = 1
    # (tests) Called with the device's socket and a path for QEMU's end of the link before
    # QEMU starts: it serves that path (a proxy that can misbehave as a broken device end
    # would) and QEMU connects there instead.  Its return value is kept as Boot.link.
    link: Callable[[Path, Path], Any] | None = None


@dataclass
class Boot:
    opts: BootOptions
    host: Any = None
    events: list[dict] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    cxl_list: Any = None
    qemu: subprocess.Popen | None = None
    service: subprocess.Popen | None = None
    # the kvcxl device (qemu="kvcxl"): the same process as ``service``, which it replaces
    device: subprocess.Popen | None = None
    link: Any = None  # what BootOptions.link returned (tests)
    t0: float = 0.0
    workdir: Path | None = None
    last_line_t: float = 0.0  # monotonic time of the last console line
    kvm_error_t: float | None = None  # monotonic time QEMU printed a KVM internal error
    ended_t: float = 0.0  # seconds from QEMU's start to its exit

    # --- paths --------------------------------------------------------------------------
    @property
    def media(self) -> Path:
        return self.workdir / "media.bin"

    @property
    def qmp_socket(self) -> Path:
        return self.workdir / "qmp.sock"

    @property
    def plugin_ring(self) -> Path:
        return self.workdir / "plugin-ring.bin"

    @property
    def device_socket(self) -> Path:
        return self.workdir / "device.sock"

    @property
    def page_state(self) -> Path:
        return self.workdir / "page-state.bin"

    @property
    def mem_ring(self) -> Path:
        return self.workdir / "mem-ring.bin"

    @property
    def service_stats(self) -> Path:
        return self.workdir / "service.json"

    def event(self, name: str) -> dict | None:
        return next((e for e in self.events if e.get("event") == name), None)

    # --- the run ------------------------------------------------------------------------
    def _check_options(self) -> None:
        """Options that contradict the QEMU chosen: ValueError, before anything starts."""
        if self.opts.qemu == "kvcxl" and not self.opts.device_emulator:
            raise ValueError(
                "--no-device-emulator needs --qemu stock: with the patched QEMU the "
                "device on the memory path answers the ring"
            )
        if not 0.0 <= self.opts.sample_rate <= 1.0:
            raise ValueError(f"--sample-rate {self.opts.sample_rate} must be in [0, 1]")
        if self.opts.sample_rate and not self.opts.alias:
            raise ValueError(
                f"--sample-rate {self.opts.sample_rate} needs --alias: without it the "
                "device counts every access and has nothing to sample"
            )
        if self.opts.heartbeat_s < 0.001 or self.opts.probe_s < 1:
            raise ValueError(
                f"--heartbeat-s {self.opts.heartbeat_s} and --probe-s {self.opts.probe_s} "
                "must be at least 1 ms and 1 s"
            )
        if self.opts.mem_link not in ("ring", "socket"):
            raise ValueError(f"--mem-link {self.opts.mem_link!r} is not 'ring' or 'socket'")
        if self.opts.qemu != "kvcxl" and (self.opts.trap or self.opts.churn or self.opts.alias):
            raise ValueError(
                "--trap, --churn and --alias need --qemu kvcxl: stock QEMU serves the "
                "device's memory itself, with no device on the memory path"
            )

    def run(self) -> dict:
        self._check_options()
        self.host = load_host()
        binary = self.host.qemu_kvcxl if self.opts.qemu == "kvcxl" else self.host.qemu
        why = accel_unusable(self.opts.accel, str(binary)) if binary else None
        if why is not None:
            raise ValueError(why)
        tcg = self.opts.accel == "tcg"
        if self.opts.plugin and not tcg:
            raise ValueError(
                f"--plugin is a TCG plugin: it cannot run with --accel {self.opts.accel}"
            )
        use_plugin = (
            self.opts.plugin if self.opts.plugin is not None else self.host.plugin_available and tcg
        )
        if use_plugin and not self.host.plugin_available:
            raise ValueError(f"the TCG plugin is not available: {self.host.plugin_error}")
        self.workdir = Path(
            self.opts.workdir or tempfile.mkdtemp(prefix="kvcxl-qemu-", dir=_shm_dir())
        ).absolute()  # QEMU runs in it (its core dump lands there)
        self.workdir.mkdir(parents=True, exist_ok=True)
        report: dict[str, Any] = {"evidence": "Measured"}
        try:
            gt = self._prepare_media()
            if self.opts.qemu == "kvcxl":
                self._start_device(use_plugin)
            else:
                self._start_service(use_plugin, self.opts.device_emulator)
            self._start_qemu(use_plugin)
            rc = self._wait()
            report.update(self._report(gt, rc, use_plugin))
        finally:
            self._cleanup()
        return report

    def _prepare_media(self) -> Any:
        size = self.opts.device_mib << 20
        if self.opts.device_mib < 256 or self.opts.device_mib % 256:
            # CXL capacity is managed in 256 MiB units (Identify Memory Device).
            raise ValueError(f"--device-mib {self.opts.device_mib}: use a multiple of 256 MiB")
        gt = self.opts.trace or default_trace()
        image = encode(gt, size)
        self.fuzz_expect = None
        if "fuzz" in self.opts.jobs:
            # The model predicts the answers of the firmware this boot runs behind the ring.
            fuzz, self.fuzz_expect = guest_fuzz.image(
                self.opts.fuzz_cases,
                self.opts.fuzz_seed,
                size,
                ring_fuzz.firmware_for(self.opts.qemu, self.opts.device_emulator),
            )
        # Guest memory: owner-only, whatever folder --keep's work directory is in.
        fd = os.open(self.media, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.truncate(size)
            f.seek(L.TRACE_BASE)
            f.write(image)
            f.seek(L.XFER_H2G)
            f.write(L.pattern(L.SEED_H2G, 0, L.XFER_BYTES))
            if self.fuzz_expect is not None:
                f.seek(L.FUZZ_BASE)
                f.write(fuzz)
        return gt

    def _start_service(self, use_plugin: bool, use_device: bool = False) -> None:
        ready = self.workdir / "service.ready"
        cmd = [
            sys.executable,
            "-m",
            "kvcxl.qemu.service",
            "--media",
            str(self.media),
            "--out",
            str(self.service_stats),
            "--ready",
            str(ready),
            "--policy",
            self.opts.policy,
            "--mode",
            self.opts.mode,
        ]
        if self.opts.config:
            cmd += ["--config", self.opts.config]
        if use_plugin:
            cmd += ["--plugin-ring", str(self.plugin_ring)]
        if use_device:
            cmd += ["--device"]
        log = open(self.workdir / "service.log", "w")
        self.service = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            umask=OWNER_ONLY,
        )
        self._await(self.service, ready, "service.log", "the firmware service")

    def _await(self, proc: subprocess.Popen, ready: Path, log: str, what: str) -> None:
        """Until ``proc`` made ``ready`` exist; its log's tail if it exits first."""
        t = time.monotonic()
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{what} exited ({proc.returncode}): " + (self.workdir / log).read_text()[-800:]
                )
            if time.monotonic() - t > 60:
                raise RuntimeError(f"{what} did not start within 60 s")
            time.sleep(0.02)

    def _start_device(self, use_plugin: bool) -> None:
        """The kvcxl device on the memory path, which also answers the ring on its doorbell:
        its DRAM tier is the media file QEMU maps, decoder 0 maps DPA to itself (QEMU
        decodes HPA), the page table is shared; a guest read of a block on NVMe fetches
        the page once, the rest goes direct."""
        if not self.host.qemu_kvcxl:
            raise SetupError("the patched QEMU is not built: run `kvcxl qemu setup`")
        cmd = [
            sys.executable, "-m", "kvcxl.qemu.ring_device",
            "--socket", str(self.device_socket),
            "--media", str(self.media),
            "--page-state", str(self.page_state),
            "--out", str(self.service_stats),
            "--policy", self.opts.policy,
            "--mode", self.opts.mode,
        ]  # fmt: skip
        if self.opts.config:
            cmd += ["--config", self.opts.config]
        if use_plugin:
            cmd += ["--plugin-ring", str(self.plugin_ring)]
        for dpa, length in self.opts.trap:
            cmd += ["--trap", f"{dpa:#x}:{length}"]
        for dpa, length in self.opts.churn:
            cmd += ["--churn", f"{dpa:#x}:{length}"]
        if self.opts.sample_rate:
            cmd += ["--sample-rate", repr(self.opts.sample_rate)]
        if self.opts.mem_link == "ring":
            cmd += ["--mem-ring", str(self.mem_ring)]
        for key, value in self.opts.health:
            cmd += ["--health", f"{key}={value}"]
        log = open(self.workdir / "device.log", "w")
        self.device = self.service = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
            umask=OWNER_ONLY,
        )  # fmt: skip
        self._await(self.device, self.device_socket, "device.log", "the kvcxl device")
        if self.opts.poison:  # into the device, before the guest probes (as a BMC would)
            with Client(self.device_socket, timeout=10) as c:
                for dpa, length in self.opts.poison:
                    for line in range(dpa, dpa + length, 64):
                        rsp = c.cci(mb.Opcode.INJECT_POISON, struct.pack("<Q", line))
                        if rsp.rc != mb.ReturnCode.SUCCESS:
                            raise ValueError(
                                f"poison at DPA {line:#x}: the device answered "
                                f"{mb.ReturnCode(rsp.rc).name}"
                            )
                    self.events.append(
                        {"event": "host_inject_poison", "dpa": hex(dpa), "length": length,
                         "into": "kvcxl device", "t": 0.0}
                    )  # fmt: skip

    def device_stats(self) -> dict | None:
        """The kvcxl device's statistics, asked over its socket (None: not running)."""
        if self.device is None or self.device.poll() is not None:
            return None
        try:
            with Client(self.device_socket, timeout=10) as c:
                rsp = c.cci(mb.Opcode.VENDOR_GET_STATS)
        except OSError:
            return None
        return json.loads(rsp.payload) if rsp.rc == mb.ReturnCode.SUCCESS else None

    def qemu_command(self, use_plugin: bool) -> list[str]:
        h = self.host
        append = (
            "console=ttyS0 quiet panic=-1 memhp_default_state=offline "
            f"kvcxl.jobs={','.join(self.opts.jobs)} kvcxl.wait={self.opts.wait_s:g} "
            f"kvcxl.heartbeat_ms={round(self.opts.heartbeat_s * 1000)} "
            f"kvcxl.probe_s={self.opts.probe_s}"
        )
        size = f"{self.opts.device_mib}M"
        kvcxl = self.opts.qemu == "kvcxl"
        t3 = f"cxl-type3,bus=root_port13,volatile-memdev=cxl-mem1,id={DEVICE_ID}"
        if kvcxl:
            sock = self.device_socket
            if self.opts.link is not None:
                sock = self.workdir / "link.sock"
                self.link = self.opts.link(self.device_socket, sock)
            t3 += f",kvcxl={sock},kvcxl-state={self.page_state}"
            if self.opts.alias:
                t3 += ",kvcxl-alias=on"
            if self.opts.mem_link == "ring":
                t3 += f",kvcxl-ring={self.mem_ring}"
        cmd = [
            h.qemu_kvcxl if kvcxl else h.qemu,
            *(_MINIMAL_BUILD if kvcxl else []),
            "-M", "q35,cxl=on",
            "-m", "2G,maxmem=8G,slots=4",
            "-smp", str(self.opts.smp),
            "-cpu", "max,hypervisor=off",
            "-accel", self.opts.accel,
            "-display", "none",
            "-serial", "stdio",
            "-monitor", "none",
            "-no-reboot",
            "-kernel", str(h.kernel),
            "-initrd", str(h.initramfs),
            "-append", append,
            "-object",
            f"memory-backend-file,id=cxl-mem1,share=on,mem-path={self.media},size={size}",
            "-device", "pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1",
            "-device", "cxl-rp,port=0,bus=cxl.1,id=root_port13,chassis=0,slot=2",
            "-device", t3,
            "-M", "cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G",
            "-qmp", f"unix:{self.qmp_socket},server=on,wait=off",
        ]  # fmt: skip
        if use_plugin:
            lo, hi = L.WINDOW_BASE, L.WINDOW_BASE + L.WINDOW_SIZE
            cmd += ["-plugin", f"{h.plugin},ring={self.plugin_ring},lo={lo:#x},hi={hi:#x}"]
        return cmd

    def _start_qemu(self, use_plugin: bool) -> None:
        cmd = self.qemu_command(use_plugin)
        (self.workdir / "qemu.cmd").write_text(" ".join(cmd) + "\n")
        self.t0 = time.monotonic()
        self.qemu = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            umask=OWNER_ONLY,  # QEMU creates the QMP socket: owner-only, as the media
            cwd=self.workdir,
            preexec_fn=_allow_core_dump,
        )
        if self.opts.poison and self.opts.qemu != "kvcxl":  # kvcxl: the device holds it
            self._inject_poison()
        self._reader = threading.Thread(target=self._read_console, daemon=True)
        self._reader.start()

    def _inject_poison(self) -> None:
        t = time.monotonic()
        while not self.qmp_socket.exists():
            if time.monotonic() - t > 20 or self.qemu.poll() is not None:
                raise RuntimeError("QEMU's QMP socket did not appear")
            time.sleep(0.02)
        with Qmp(self.qmp_socket) as q:
            for dpa, length in self.opts.poison:
                q.inject_poison(dpa, length)
                self.events.append(
                    {"event": "host_inject_poison", "dpa": hex(dpa), "length": length,
                     "t": time.monotonic() - self.t0}
                )  # fmt: skip

    def _read_console(self) -> None:
        block: list[str] | None = None
        # Line-buffered, so that a hung guest's last words are on disk.
        log = open(self.workdir / "console.log", "w", buffering=1)
        for raw in self.qemu.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.last_line_t = time.monotonic()
            if line.startswith(KVM_INTERNAL_ERROR) and self.kvm_error_t is None:
                # KVM could not emulate a guest access (e.g. an AVX load from MMIO): QEMU
                # stops the VM and would wait for ever; _wait ends the boot, failed.
                self.kvm_error_t = self.last_line_t
                self.events.append(
                    {"event": "kvm_internal_error", "line": line,
                     "t": round(self.last_line_t - self.t0, 3)}
                )  # fmt: skip
            log.write(line + "\n")
            self.console.append(line)
            if self.opts.console:
                self.opts.console(line)
            if line.startswith("@kvcxl-begin cxl-list"):
                block = []
                continue
            if line.startswith("@kvcxl-end cxl-list"):
                try:
                    self.cxl_list = json.loads("\n".join(block or []))
                except ValueError:
                    self.cxl_list = {"unparsed": "\n".join(block or [])}
                block = None
                continue
            if block is not None:
                block.append(line)
                continue
            if line.startswith(MARK):
                try:
                    ev = json.loads(line[len(MARK) :])
                except ValueError:
                    continue
                ev["t"] = round(time.monotonic() - self.t0, 3)
                self.events.append(ev)
                self._on_event(ev)
        log.close()

    def _on_event(self, ev: dict) -> None:
        if ev.get("event") == "region_ready" and self.opts.media_events:
            try:
                with Qmp(self.qmp_socket) as q:
                    for dpa in self.opts.media_events:
                        q.inject_media_event(dpa)
                        self.events.append({"event": "host_inject_media_event", "dpa": hex(dpa)})
            except Exception as exc:  # report, never hang the console reader
                self.events.append({"event": "host_inject_failed", "reason": str(exc)})
        if self.opts.on_event is not None:
            try:
                self.opts.on_event(ev, self)
            except Exception as exc:
                self.events.append({"event": "hook_failed", "reason": str(exc)})

    def _wait(self) -> int:
        stall = self.opts.stall_s + self.opts.wait_s
        self.last_line_t = max(self.last_line_t, time.monotonic())
        deadline = time.monotonic() + self.opts.timeout
        rc = None
        while rc is None:
            try:
                rc = self.qemu.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if self.kvm_error_t is not None and now - self.kvm_error_t >= 1.0:
                    pass  # QEMU stopped the VM; its register dump has been printed
                elif now >= deadline:
                    self.events.append({"event": "host_timeout", "timeout_s": self.opts.timeout})
                elif now - self.last_line_t >= stall:
                    self.events.append(
                        {"event": "host_stall", "silent_s": round(now - self.last_line_t, 1),
                         "t": round(now - self.t0, 3)}
                    )  # fmt: skip
                else:
                    continue
                self._quit_qemu()
                rc = self.qemu.wait(timeout=30)
        self.ended_t = time.monotonic() - self.t0
        self._reader.join(timeout=10)
        return rc

    def failed_before_agent(self, report: dict) -> dict | None:
        """Why this boot failed before the kvcxl agent started, in QEMU's or Linux's code (the
        guest stalled, or QEMU ended on a signal, e.g. an assertion in its TCG memory map),
        as :func:`boot` records a retry; None when it did not, or failed after the agent."""
        names = {e["event"] for e in self.events}
        if "agent_start" in names:
            return None
        stall = next((e for e in self.events if e["event"] == "host_stall"), None)
        if stall is not None:
            why = {"why": "stall", "silent_s": stall["silent_s"], "t": stall["t"]}
        elif report.get("qemu_crash"):
            crash = report["qemu_crash"]
            why = {"why": "qemu_crash", "signal": crash["signal"],
                   "t": round(self.ended_t, 3),
                   "backtrace": (crash.get("backtrace") or [])[:12]}  # fmt: skip
        else:
            return None
        return {**why, "console_tail": self.console[-20:]}

    def _quit_qemu(self) -> None:
        """Ask QEMU to quit over QMP; kill its process group if it does not."""
        try:
            with Qmp(self.qmp_socket) as q:
                q.cmd("quit")
            self.qemu.wait(timeout=10)
        except Exception:
            _kill_group(self.qemu)

    def kill_service(self) -> None:
        """Fault injection: the firmware service dies (SIGKILL, no goodbye)."""
        if self.service is not None and self.service.poll() is None:
            os.killpg(self.service.pid, signal.SIGKILL)
            self.events.append({"event": "host_killed_service", "t": time.monotonic() - self.t0})

    def kill_device(self) -> None:
        """Fault injection: the kvcxl device service dies (SIGKILL, no goodbye)."""
        if self.device is not None and self.device.poll() is None:
            os.killpg(self.device.pid, signal.SIGKILL)
            self.events.append({"event": "host_killed_device", "t": time.monotonic() - self.t0})

    def _stop_service(self) -> dict | None:
        if self.service is None:
            return None
        if self.service.poll() is None:
            os.killpg(self.service.pid, signal.SIGTERM)
            try:
                self.service.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _kill_group(self.service)
        try:
            return json.loads(self.service_stats.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _cleanup(self) -> None:
        if self.qemu is not None and self.qemu.poll() is None:
            _kill_group(self.qemu)
        if self.service is not None and self.service.poll() is None:
            _kill_group(self.service)
        if self.device is not None and self.device.poll() is None:
            _kill_group(self.device)
        if self.workdir is not None and not self.opts.keep and self.opts.workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- the report -----------------------------------------------------------------------
    def _report(self, gt: Any, rc: int, use_plugin: bool) -> dict:
        device = self.device_stats()
        host_check = self._host_side_check(gt)  # through the device, while it runs
        fuzz_results = None
        if self.fuzz_expect is not None:
            with self._device_reader() as read:
                fuzz_results = read(*guest_fuzz.results_span(self.fuzz_expect))
        fw = self._stop_service()
        self.victims: list[list[int]] = []  # per firmware session, in order
        for sess in (fw or {}).get("sessions", []):
            v = sess.pop("victims", [])
            sess["victims_head"] = v[:16]
            self.victims.append(v)
        ev = {e["event"]: e for e in self.events}
        times = {}
        for name, key in (("init", "boot_to_init_s"), ("region_ready", "boot_to_region_ready_s")):
            if name in ev:
                times[key] = ev[name]["t"]
                times[key.replace("_s", "_guest_uptime_s")] = ev[name].get("uptime")
        fuzz = None
        if self.fuzz_expect is not None:
            fuzz = guest_fuzz.check(fuzz_results, self.fuzz_expect)
            seen = ev.get("fuzz", {})
            fuzz["changed_bytes"] += seen.get("kv_guard_bad", 0)
            fuzz["guest_wall_s"] = seen.get("fuzz_s")
            fuzz["service_errors_counted"] = (fw or {}).get("errors")
        out = {
            "qemu": {
                "version": self.host.qemu_version,
                "exit_code": rc,
                "command": (self.workdir / "qemu.cmd").read_text().strip(),
                "plugin": "on" if use_plugin else "off",
                "plugin_note": None
                if use_plugin
                else (self.host.plugin_error or "TCG plugin built but not enabled (--plugin)"),
                "smp": self.opts.smp,
                "accel": self.opts.accel,
            },
            "kernel": self.host.kernel_version,
            "trace": {
                "source": gt.source,
                "entries": gt.n_entries,
                "entry_bytes": gt.entry_bytes,
                "capacity_entries": gt.capacity,
                "reads": int(gt.stream.n_reads),
                "steps": int(gt.stream.n_steps),
            },
            "timings": times,
            "wall_s": round(time.monotonic() - self.t0, 3),
            "region": ev.get("region"),
            "cxl_list": self.cxl_list,
            "guest": {
                k: ev[k]
                for k in (
                    "datapath",
                    "replay",
                    "malformed",
                    "fuzz",
                    "widths",
                    "widths_in_line",
                    "bench",
                    "device_error",
                    "poison_list",
                    "tracing",
                    "waiting",
                )
                if k in ev
            },
            "jobs": list(self.opts.jobs),
            # jobs asked for whose result never came (guest_result says why)
            "missing_results": [j for j in self.opts.jobs if job_event(j) not in ev],
            "guest_failures": [e for e in self.events if e["event"] in FAILURE_EVENTS],
            "qemu_crash": self._crash(rc),
            "cxl_trace": [e["line"] for e in self.events if e["event"] == "cxl_trace"],
            "host_check": host_check,
            "guest_fuzz": fuzz,
            "firmware": fw,
            "kvcxl_device": _device_summary(device, fw) if self.opts.qemu == "kvcxl" else None,
            "events": self.events,
        }
        if self.kvm_error_t is not None:
            at = next(i for i, ln in enumerate(self.console) if ln.startswith(KVM_INTERNAL_ERROR))
            said = (
                [self.console[at]]
                + [  # the error, where, and the instruction's bytes
                    ln
                    for ln in self.console[at + 1 : at + 40]
                    if ln.startswith(("emulation failure", "RIP=", "Code="))
                ]
            )
            out["kvm_internal_error"] = {
                "t": ev["kvm_internal_error"]["t"],
                "qemu_said": said,
                "last_guest_event": next(
                    (
                        e["event"]
                        for e in reversed(self.events)
                        if not e["event"].startswith(("host_", "kvm_", "hook_"))
                    ),
                    None,
                ),
            }
        if "poweroff" not in ev or rc != 0 or out["missing_results"] or out["guest_failures"]:
            # The guest did not finish, or a job did not: keep what the console and the
            # device (or service) said last, which the work directory's removal loses.
            out["console_tail"] = self.console[-CONSOLE_TAIL:]
            out["device_log_tail"] = self._log_tail()
        return out

    def _log_tail(self, lines: int = 20) -> list[str]:
        """The last lines of the device's (or the firmware service's) log: a traceback there
        is why the ring stopped answering."""
        for name in ("device.log", "service.log"):
            path = self.workdir / name
            if path.exists():
                return path.read_text(errors="replace").splitlines()[-lines:]
        return []

    def _crash(self, rc: int) -> dict | None:
        """QEMU ended by a signal: which one and, from its core dump, where (gdb's
        backtraces), so that a crash seen once can be diagnosed from the report alone."""
        if rc >= 0:
            return None
        try:
            name = signal.Signals(-rc).name
        except ValueError:  # a real-time signal has no name of its own
            name = f"signal {-rc}"
        out: dict[str, Any] = {"signal": name, "backtrace": None}
        core = next(iter(sorted(self.workdir.glob("core*"))), None)
        gdb = shutil.which("gdb")
        if core is None:
            pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
            out["note"] = f"no core dump in the work directory (kernel.core_pattern: {pattern})"
        elif gdb is None:
            out["note"] = "a core dump was written, but gdb is not installed to read it"
        else:
            cmd = [gdb, "-batch", "-nx", "-ex", "bt 40", "-ex", "thread apply all bt 16",
                   self.qemu.args[0], str(core)]  # fmt: skip
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                out["note"] = "gdb took over 300 s to read the core dump"
            else:
                keep = ("#", "Thread ", "Program terminated", "Core was generated")
                out["backtrace"] = [ln for ln in r.stdout.splitlines() if ln.startswith(keep)]
        if core is not None and not self.opts.keep:
            core.unlink()  # hundreds of MB (the guest's RAM), in /dev/shm by default
        return out

    def _host_side_check(self, gt: Any) -> dict:
        """The host reads what the guest wrote into the device: from the media file, or
        (--qemu kvcxl) through the device, which knows which tier holds each page."""
        out: dict[str, Any] = {}
        with self._device_reader() as read:
            got = read(L.XFER_G2H, L.XFER_BYTES)
            want = L.pattern(L.SEED_G2H, 0, L.XFER_BYTES)
            if "datapath" in self.opts.jobs:
                out["guest_to_host_bad_bytes"] = sum(a != b for a, b in zip(got, want, strict=True))
            if {"widths", "widths_in_line"} & set(self.opts.jobs):
                # the device's bytes (whichever tier holds each page) hash as the guest's shadow
                out["widths_device_fnv"] = L.fnv1a_bytes(read(L.WIDTHS_BASE, L.WIDTHS_BYTES))
            if "replay" in self.opts.jobs:
                bad = checked = 0
                eb = gt.entry_bytes
                for e in range(0, gt.n_entries, max(1, gt.n_entries // 64)):
                    data = read(L.KV_BASE + e * eb, eb)
                    bad += sum(a != b for a, b in zip(data, L.pattern(gt.seed, e, eb), strict=True))
                    checked += 1
                out["kv_entries_checked"] = checked
                out["kv_bad_bytes"] = bad
        return out

    @contextlib.contextmanager
    def _device_reader(self):
        """``read(dpa, n)``: the device's bytes (through its socket) or the media file's."""
        if self.opts.qemu == "kvcxl" and self.device is not None and self.device.poll() is None:
            with Client(self.device_socket, timeout=30) as c:
                yield lambda dpa, n: c.read(dpa, n)[0]  # decoder 0 is the identity
            return
        with open(self.media, "rb") as f:

            def read(dpa: int, n: int) -> bytes:
                f.seek(dpa)
                return f.read(n)

            yield read


# The patched QEMU is a minimal build with no firmware of its own: it takes Debian's, and
# the guest needs no NIC (whose option ROMs it would look for).
_MINIMAL_BUILD = ("-L", "/usr/share/qemu", "-L", "/usr/share/seabios", "-nic", "none")


def _device_summary(stats: dict | None, ring: dict | None = None) -> dict | None:
    """What the kvcxl device saw of the guest's traffic (None: it did not answer); ``ring``:
    the statistics it wrote on exit."""
    if stats is None:
        return None
    c = stats["counters"]
    return {
        "direct_accesses": stats["direct_accesses"],  # completed by QEMU on DIRECT pages
        "mem_requests": c["mem_requests"],  # CXL.mem requests the device served (slow path)
        "reads": c["reads"],
        "writes": c["writes"],
        "poisoned_reads": c["poisoned_reads"],
        "poisoned_lines": stats["poisoned_lines"],
        "nvme_accesses": c["nvme_accesses"],  # guest accesses served from the NVMe tier
        "nvme_fills": c["nvme_fills"],  # pages a guest access fetched from NVMe into DRAM
        "migrations_to_nvme": c["migrations_to_nvme"],
        "migrations_to_dram": c["migrations_to_dram"],
        "requests": stats["requests"],  # modelled latency percentiles of those requests
        # --alias: QEMU's RAM mapping of DIRECT pages (as the table shows it at the end),
        # demotions that waited for QEMU to unmap their pages, and the device's checks that
        # every page QEMU mapped was in DRAM (each move out of DRAM and every 5 ms)
        "alias": stats.get("alias"),
        "demotions_deferred": c.get("demotions_deferred", 0),
        "unmaps_awaited": c.get("unmaps_awaited", 0),
        "alias_checks": c.get("alias_checks", 0),
        "alias_violations": c.get("alias_violations", 0),
        # per area of its memory (ring, transfer buffers, widths, the bench block): trapped
        # requests, QEMU's direct accesses, pages mapped as guest RAM, as it stopped
        "areas": (ring or {}).get("areas"),
    }


def failure_summary(report: dict) -> dict:
    """The parts of a boot report that say why QEMU or the guest did not finish cleanly
    (what a failed check should print)."""
    keys = ("missing_results", "guest_failures", "qemu_crash", "kvm_internal_error",
            "device_log_tail", "console_tail")  # fmt: skip
    return {k: report[k] for k in keys if report.get(k)}


class NoGuestResult(AssertionError):
    """A guest job returned no result; the message is what the guest, QEMU and the device
    said about why (an AssertionError: a test that asked for the result fails with it)."""


def job_event(job: str) -> str:
    """The guest event that carries ``job``'s result (the agent's jobs emit their own name)."""
    return JOB_EVENT.get(job, job)


def why_no_result(report: dict, job: str) -> str:
    """Why the guest returned no ``job`` result, in the guest's own words first: its
    failure events (/init's failed step, the agent's error, the ring's device error), then
    the host's (timeout, stall, QEMU's exit or crash), the device's log and the console's
    last lines."""

    def said(e: dict) -> str:
        rest = {k: v for k, v in e.items() if k not in ("event", "t", "uptime")}
        at = f" at {round(float(e['t']), 3)} s" if "t" in e else ""
        return f"{e['event']}{at}: {json.dumps(rest)}"

    events = report.get("events", [])
    guest = [said(e) for e in events if e.get("event") in FAILURE_EVENTS]
    host = [said(e) for e in events if e.get("event") in HOST_FAILURE_EVENTS]
    q = report.get("qemu") or {}
    host.append(f"QEMU exit code {q.get('exit_code')}")
    for k in ("qemu_crash", "kvm_internal_error"):
        if report.get(k):
            host.append(f"{k}: {json.dumps(report[k])[:2000]}")
    started = [e for e in events if e.get("event") == "agent_start" and e.get("job") == job]
    lines = [
        f"the guest returned no {job!r} result (asked: {report.get('jobs')}; "
        f"the agent {'started it' if started else 'never started it'})",
        "the guest said: " + ("; ".join(guest) if guest else "nothing about a failure"),
        "the host saw: " + "; ".join(host),
    ]
    if report.get("device_log_tail"):
        lines.append("the device's log, last lines:")
        lines += ["  " + ln for ln in report["device_log_tail"]]
    tail = report.get("console_tail") or []
    lines.append(f"the guest console, last {len(tail)} lines:")
    lines += ["  " + ln for ln in tail]
    return "\n".join(lines)


def guest_result(report: dict, job: str) -> dict:
    """The result the guest returned for ``job``; :class:`NoGuestResult`, saying why from
    the report (:func:`why_no_result`), when it returned none."""
    got = report.get("guest", {}).get(job_event(job))
    if got is None:
        raise NoGuestResult(why_no_result(report, job))
    return got


def _allow_core_dump() -> None:
    """In QEMU's process before exec: a crash leaves a core dump (up to the hard limit)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _shm_dir() -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def boot(opts: BootOptions) -> tuple[dict, Boot]:
    """Run one boot, retried per ``opts.retries`` when it fails before the agent starts
    (:meth:`Boot.failed_before_agent`: a stall, or QEMU ending on a signal)."""
    retried: list[dict] = []
    while True:
        b = Boot(opts)
        report = b.run()
        why = b.failed_before_agent(report)
        if why is None or len(retried) >= opts.retries:
            break
        retried.append(why)
    report["boot_retries"] = retried
    return report, b
