"""The error a library module raises for something the user can fix (a missing or altered
file, a tool not installed): the ``kvcxl`` command line prints it as one line and exits 2.

Library modules raise :class:`UserError` (or a subclass); only the command line
(``kvcxl.emu.cli``) catches it, so no library module needs to import the CLI.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix, said in one line (``kvcxl``: exit status 2)."""
