"""The one refusal the device names: a host's request out of bounds."""

from __future__ import annotations


class RequestError(ValueError):
    """A host's request the device refuses (an id, weight, length or range out of bounds):
    the protocol's Invalid Input.  Only this is answered so; a plain ValueError from the
    device is a bug and is counted as one."""
