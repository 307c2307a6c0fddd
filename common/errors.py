"""The errors a library module raises for something the user can fix or must know (a bad
value, a missing or altered file, a tool not installed, not root): the ``kvcxl`` command line
prints them as one line and exits with their ``exit_code``.

Library modules raise :class:`UserError` (exit 2: the input was wrong) or :class:`Failure`
(exit 1: the input was fine but the run failed: a tool or package missing, not root, a
check that found a fault).  Only the command line (``kvcxl.cli.main``) catches them, so no
library module needs to import the CLI.  A part that may not import the emulator (the RTL,
the testbench) gives its own error class an integer class attribute ``exit_code``: the
command line treats any exception whose class has one the same way.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix, said in one line (``kvcxl``: exit status 2)."""

    exit_code = 2


class Failure(UserError):
    """The input was valid but the run failed for a reason the user must act on (a missing
    tool or package, not root, a check that failed), said in one line (exit status 1)."""

    exit_code = 1
