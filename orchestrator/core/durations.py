"""Durations as people write them in YAML: ``30``, ``"90s"``, ``"15m"``, ``"1h30m"``.

A health timeout of "15" meaning fifteen seconds or fifteen minutes is the
kind of ambiguity that ends a deploy early, so bare numbers are always
seconds and everything else needs a unit.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")

_HINT = "use seconds or a number with a unit: 500ms, 90s, 15m, 1h, 1h30m"


def parse_duration(value: Any) -> float:
    """Return ``value`` in seconds; ``ValueError`` with a readable message otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {_HINT}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        elif _WHOLE.fullmatch(text):
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
        else:
            raise ValueError(f"invalid duration {value!r}: {_HINT}")
    else:
        raise ValueError(f"invalid duration {value!r}: {_HINT}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {value!r}: must be a finite number >= 0")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A pydantic field type: accepts what ``parse_duration`` accepts, stores seconds."""
