"""The transfer timeline: every byte the replay moves, queued on the resources it crosses.

docs/timeline.md is the contract.  :mod:`.resources` holds the resources, the stages of
each move and the timing presets; :mod:`.log` the transfer log the replay records;
:mod:`.engine` schedules it (a discrete-event loop); :mod:`.report` turns the schedule
into tokens/s, utilisation, queueing delay, prefetch lateness and energy.
"""

from .engine import Schedule, run
from .log import Record, TransferLog
from .report import report
from .resources import PRESETS, Preset, Resources

__all__ = [
    "PRESETS",
    "Preset",
    "Record",
    "Resources",
    "Schedule",
    "TransferLog",
    "report",
    "run",
]
