# Stand-in server: how ServerArgs collects the fields of the namespaces.
"""Namespace declarations for input configuration.

``ServerArgs`` collects input fields from the classes in ``_INPUT_NAMESPACES``
(``server_args.py``), in ``POSITIONAL_FIELD_ORDER`` first, then in
declaration order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Tuple, get_type_hints

from sglang.srt.arg_groups.field_order import POSITIONAL_FIELD_ORDER


def collect_input_fields(sources: List[type]) -> List[Tuple[str, Any, Any]]:
    """``(name, annotation, field)`` of every namespace field, for ``dataclasses.make_dataclass``."""
    found = {}
    for source in sources:
        hints = get_type_hints(source, include_extras=True)
        for field in dataclasses.fields(source):
            if field.name in found:
                raise ValueError(f"{field.name!r} is declared twice; a field belongs to one namespace")
            default = (
                dataclasses.field(default=field.default)
                if field.default is not dataclasses.MISSING
                else dataclasses.field()
            )
            found[field.name] = (field.name, hints[field.name], default)
    known = [name for name in POSITIONAL_FIELD_ORDER if name in found]
    rest = [name for name in found if name not in set(POSITIONAL_FIELD_ORDER)]
    return [found[name] for name in known + rest]
