# Stand-in server: flags made from annotated dataclass fields, standard library only.
# ruff: noqa: UP006, UP007, UP035, UP045
"""Flags derived from ``A[type, "help", ...]`` dataclass fields (the stand-in's own, small version).

SGLang 0.5.14 and later declare a flag as one annotated field and build the
argument parser from the dataclass (``add_cli_args_from_dataclass``). This
module keeps that shape so orch's ``add_flag`` meets the same layout here as
on a real box — including the trap: a field *without* ``A[...]`` compiles,
passes every syntax check, and is silently not a flag. Needs Python >= 3.9
(``typing.Annotated``).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Annotated, Any, List, Optional, Union, get_args, get_origin, get_type_hints

A = Annotated


@dataclasses.dataclass(frozen=True)
class Arg:
    """Command-line metadata of a field, beyond its help text."""

    help: str = ""
    choices: Optional[list] = None
    aliases: Optional[List[str]] = None
    cli_name: Optional[str] = None
    required: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class NS:
    """The namespace a field belongs to (a marker beside its help, as in SGLang 0.5.18)."""

    path: str


def _metadata(hint: Any) -> Optional[Arg]:
    if get_origin(hint) is not Annotated:
        return None
    for extra in get_args(hint)[1:]:
        if isinstance(extra, Arg):
            return extra
        if isinstance(extra, str):
            return Arg(help=extra)
    return None


def _scalar(hint: Any) -> Any:
    """``Optional[int]`` -> ``int``; ``Annotated[X, ...]`` -> ``X``."""
    if get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    if get_origin(hint) is Union:
        rest = [a for a in get_args(hint) if a is not type(None)]
        if len(rest) == 1:
            hint = rest[0]
    return hint


def add_cli_args_from_dataclass(parser: argparse.ArgumentParser, cls: type) -> None:
    """One ``--flag`` per ``A[...]`` field of ``cls``; plain fields are skipped."""
    hints = get_type_hints(cls, include_extras=True)
    for field in dataclasses.fields(cls):
        arg = _metadata(hints.get(field.name))
        if arg is None:
            continue
        names = [arg.cli_name or "--" + field.name.replace("_", "-")] + list(arg.aliases or [])
        kwargs: dict = {"dest": field.name, "help": arg.help}
        has_default = field.default is not dataclasses.MISSING
        if has_default:
            kwargs["default"] = field.default
        kind = _scalar(hints[field.name])
        if kind is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = kind if kind in (int, float, str) else str
            if arg.choices:
                kwargs["choices"] = arg.choices
            if arg.required or (arg.required is None and not has_default):
                kwargs["required"] = True
        parser.add_argument(*names, **kwargs)
