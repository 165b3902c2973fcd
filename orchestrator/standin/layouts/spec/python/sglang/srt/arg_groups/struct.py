# Stand-in server: a standard-library stand-in for msgspec.Struct.
"""``Struct``: every subclass is a dataclass (SGLang >= 0.5.20 uses ``msgspec.Struct``).

The stand-in stays stdlib-only; the namespaces keep the shape orch sees on a
real box: ``class Spec(Struct)`` holding ``A[type, "help"]`` fields.
"""

import dataclasses


class Struct:
    """Base of the field namespaces: a subclass becomes a dataclass when it is defined."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(cls)
