"""The fast engine's policies, one module each (:mod:`kvcxl.emu.sim.fast.hooks` is the
interface every module implements).  The registry (:func:`kvcxl.emu.sim.fast.compose.modules`)
finds them by walking this package: adding a policy is adding a module here."""
