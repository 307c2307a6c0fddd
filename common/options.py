"""Option tables: a command module lists its options as rows, and one function adds them.

A row is ``opt("--flag", type=..., default=..., help=...)``: the arguments of argparse's
``add_argument``, kept as data so that a command's options read as a table (name, default,
help) instead of a long ``register`` function.  :class:`Group` rows become an argument group
or a mutually exclusive group; :func:`add_parser` makes a subcommand from its table.

Standard library only: every command module imports it at its top.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: One option: the flags (or a positional's name) and the keywords of ``add_argument``.
Option = tuple[tuple[str, ...], dict[str, Any]]


def opt(*flags: str, **kwargs: Any) -> Option:
    """A row of an option table: ``add_argument(*flags, **kwargs)``, to be done later."""
    return flags, kwargs


@dataclass(frozen=True)
class Group:
    """Rows added to an argument group (``title``), or, with ``exclusive``, to a mutually
    exclusive group (``required``: one of them must be given)."""

    title: str | None
    rows: tuple[Row, ...]
    exclusive: bool = False
    required: bool = False


Row = Option | Group


def add_options(parser: Any, rows: Iterable[Row]) -> None:
    """Add every row of the table to ``parser`` (a parser or an argument group), in order."""
    for row in rows:
        if isinstance(row, Group):
            target = (
                parser.add_mutually_exclusive_group(required=row.required)
                if row.exclusive
                else parser.add_argument_group(row.title)
            )
            add_options(target, row.rows)
        else:
            flags, kwargs = row
            parser.add_argument(*flags, **kwargs)


def add_parser(
    sub: argparse._SubParsersAction,
    name: str,
    rows: Iterable[Row] = (),
    *,
    func: Callable[[argparse.Namespace], int] | None = None,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """The subcommand ``name`` (``kwargs``: help, description, epilog, formatter_class) with
    the options of ``rows``, run by ``func``."""
    p = sub.add_parser(name, **kwargs)
    add_options(p, rows)
    if func is not None:
        p.set_defaults(func=func)
    return p
