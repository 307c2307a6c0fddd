"""Verilog export of the engines (Amaranth's bundled Yosys; no system tools needed)."""

from __future__ import annotations

from pathlib import Path

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig

from .designs import check_shape, get


def default_decay(config: PolicyConfig | None = None) -> list[int]:
    """The reset contents of the decay table: the golden model's table for the config."""
    cfg = config or PolicyConfig()
    return [int(v) for v in fx.decay_table(cfg.beta, cfg.decay_shift)]


def build(design: str, **params):
    """The Amaranth component of ``design`` (a name of :data:`kvcxl.rtl.designs.DESIGNS`)."""
    return get(design).factory(**params)


def verilog_params(design: str, **shape) -> dict:
    """The parameters ``kvcxl rtl verilog`` builds ``design`` with: the registry's defaults,
    the given shape options over them, and the firmware's decay table where it takes one."""
    d = get(design)
    params = {**d.defaults, **{k: v for k, v in shape.items() if k in d.defaults and v is not None}}
    check_shape(d, params)
    if d.decay:
        params["decay_init"] = default_decay()
    return params


def to_verilog(component, name: str) -> str:
    from amaranth.back import verilog  # lazy: the 'hdl' extra (see build)

    return verilog.convert(component, name=name, emit_src=False)


# The FuseSoC core description that ships beside the core design's Verilog.
CORE_FILE = Path(__file__).with_name("kvcxl_rtl.core")


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds it (keeps simulator builds incremental)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
