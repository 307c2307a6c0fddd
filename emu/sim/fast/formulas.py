"""The firmware's formula kernels, compiled for the fast engine: the same functions, not copies.

``firmware/formulas.py`` and ``firmware/fixedpoint.py`` write each formula once, as a
``*_step`` kernel in plain arithmetic; numba compiles those very functions here, so a
change there reaches the fast engine (and the RTL generator, which calls the Q0.16
kernels on Amaranth values) with nothing to keep in step.  tests/test_sim_fast.py checks
them bit for bit against the firmware's array forms; tests/test_one_definition.py fails if
a formula is written out anywhere else.
"""

from __future__ import annotations

from numba import njit
from numba.extending import register_jitable

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware import formulas as fm

_jit = njit(cache=True, inline="always")

# The helpers the kernels call: compiled where a kernel calls them (and still plain Python
# functions for numpy and Amaranth callers).
for _helper in (fx.q16_round, fx.ema_q16_products):
    register_jitable(_helper)

ema_float = _jit(fm.ema_step)
priority_float = _jit(fm.priority_step)
blend_float = _jit(fm.blend_step)
ema_q16 = _jit(fx.ema_q16_step)
priority_q16_of_decay = _jit(fx.priority_q16_step)
blend_q16 = _jit(fx.blend_q16_step)
