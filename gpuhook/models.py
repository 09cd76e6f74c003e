"""pydantic models for what crosses a boundary to people and tools: `probe --json` output.

Derived from the inventory's records (gpuhook/inventory.py), field by field, so the schema
is the records' shape (Record.to_plain) and cannot drift from it; only the constraints a
schema adds (device paths under /dev, node types, non-negative numbers) are written here.
Kept off the per-container path (pydantic costs ~100 ms to import there).
"""

from __future__ import annotations

import typing
from types import NoneType, UnionType

from pydantic import BaseModel, ConfigDict, Field, create_model

from . import inventory
from .record import Record

# what a schema says beyond the records' types
CONSTRAINTS: dict[tuple[str, str], dict] = {
    ("Node", "path"): {"pattern": r"^/dev/"},
    ("Node", "type"): {"pattern": r"^[cb]$"},
    ("Node", "major"): {"ge": 0},
    ("Node", "minor"): {"ge": 0},
    ("Device", "index"): {"ge": 0},
    ("Device", "memory"): {"gt": 0},
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_made: dict[type, type[BaseModel]] = {}


def _type(t):
    """A record's annotation as a pydantic type: records become their models, tuples lists."""
    if isinstance(t, type) and issubclass(t, Record):
        return model_of(t)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[_type(args[0])]  # type: ignore[misc]
    if origin in (UnionType, typing.Union) and NoneType in args:
        (inner,) = [a for a in args if a is not NoneType]
        return _type(inner) | None
    return t


def model_of(cls: type[Record]) -> type[BaseModel]:
    """The pydantic model of a record class (made once)."""
    if cls not in _made:
        hints = typing.get_type_hints(cls)
        fields = {}
        for name in cls._fields:
            default = cls._defaults.get(name, ...)
            fields[name] = (_type(hints[name]), Field(default, **CONSTRAINTS.get((cls.__name__, name), {})))
        _made[cls] = create_model(f"{cls.__name__}Model", __base__=_Strict, **fields)  # type: ignore[call-overload]
    return _made[cls]


InventoryModel = model_of(inventory.Inventory)
InventoryModel.__doc__ = "Schema of `gpuhook probe --json`."
