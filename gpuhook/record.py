"""Record: an immutable tuple with named, typed fields, for the small types of the pipeline.

collections.namedtuple builds each class with exec(), about a millisecond a class on a slow
node; typing.NamedTuple and dataclasses cost more to import. These types are on the path of
every container start, so they are built from this one plain base class instead. The
fields are the class's annotations, in order (a type checker reads them as attributes); a
field with a value in the class body has that default, and only trailing fields may:

    class Node(Record):
        path: str
        major: int
        present: bool = True
        __slots__ = ()

Modules that define records use `from __future__ import annotations`: the annotations stay
strings, never evaluated, so they cost nothing at import.
"""


def _getter(i: int):
    return lambda self: tuple.__getitem__(self, i)


class Record(tuple):
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict = {}

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        names = tuple(n for n in cls.__dict__.get("__annotations__", {}) if not n.startswith("_"))
        defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
        first_default = next((i for i, n in enumerate(names) if n in defaults), len(names))
        if any(n not in defaults for n in names[first_default:]):
            raise TypeError(f"{cls.__name__}: a field without a default after one with a default")
        cls._fields = names
        cls._defaults = defaults
        for i, name in enumerate(names):
            setattr(cls, name, property(_getter(i), doc=f"field {i}: {name}"))

    def __new__(cls, *args, **kwargs):
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__} takes {len(fields)} fields, got {len(args)}")
        values = list(args)
        for name in fields[len(args) :]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._defaults:
                values.append(cls._defaults[name])
            else:
                raise TypeError(f"{cls.__name__}: missing field {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}: unknown or repeated field(s) {', '.join(kwargs)}")
        return tuple.__new__(cls, values)

    def __getnewargs__(self):
        return tuple(self)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({inner})"

    def _asdict(self) -> dict:
        return dict(zip(self._fields, self, strict=True))

    def _replace(self, **changes):
        return type(self)(**{**self._asdict(), **changes})
