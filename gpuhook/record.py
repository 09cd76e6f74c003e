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

A field's annotation is a plain class (str, int, bool, float, a record class defined above)
or a string, which is never evaluated: `pci: "str | None" = None`, `nodes: "tuple[Node, ...]"`
(evaluating `X | None` or `tuple[...]` at import costs time on every container start, as
`from __future__ import annotations` does, by importing __future__). A field reads
through namedtuple's own C accessor where the interpreter has it.
"""

try:
    from _collections import _tuplegetter  # namedtuple's field accessor: C, built in
except ImportError:  # another interpreter

    def _tuplegetter(index: int, doc: str):  # type: ignore[misc]
        return property(lambda self: tuple.__getitem__(self, index), doc=doc)


class Record(tuple):
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict = {}
    _kinds_cache: dict | None = None  # from_plain's view of the annotations, made once per class

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        annotations = cls.__dict__.get("__annotations__", {})
        names = tuple(n for n in annotations if not n.startswith("_"))
        for n in names:
            if not isinstance(annotations[n], (str, type)):
                raise TypeError(f"{cls.__name__}.{n}: quote the annotation (a string, never evaluated)")
        defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
        first_default = next((i for i, n in enumerate(names) if n in defaults), len(names))
        if any(n not in defaults for n in names[first_default:]):
            raise TypeError(f"{cls.__name__}: a field without a default after one with a default")
        cls._fields = names
        cls._defaults = defaults
        for i, name in enumerate(names):
            setattr(cls, name, _tuplegetter(i, f"field {i}: {name}"))

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

    # -- plain data (JSON) ------------------------------------------------------------------
    # The shape of a record as JSON is its fields, by name: records become objects, tuples
    # lists. Back from JSON, each field is rebuilt from its annotation (strings, read with no
    # import: a record class by name from the module that defines it, `tuple[X, ...]`,
    # `X | None`), so the records are the one truth of the shape (the probe cache, `probe
    # --json`, models.py's schema).

    def to_plain(self) -> dict:
        return {name: _plain(value) for name, value in zip(self._fields, self, strict=True)}

    @classmethod
    def from_plain(cls, data: dict):
        """The record from to_plain()'s output; KeyError/TypeError/ValueError on anything else."""
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: not an object")
        kinds = cls._kinds()
        defaults = cls._defaults
        values = []
        for name in cls._fields:
            if name in data:
                value, (what, inner, _) = data[name], kinds[name]
                # most fields: a plain value of exactly one of the field's types, as it is
                ok = what == "value" and inner is not None and type(value) in inner
                values.append(value if ok else _rebuild(kinds[name], value))
            elif name in defaults:
                values.append(defaults[name])
            else:
                raise KeyError(f"{cls.__name__}.{name}")
        return tuple.__new__(cls, values)  # every field in order: what cls(**fields) makes

    @classmethod
    def _kinds(cls) -> dict:
        kinds = cls.__dict__.get("_kinds_cache")
        if kinds is None:
            import sys

            names = vars(sys.modules[cls.__module__])
            annotations = cls.__annotations__
            kinds = {n: _kind(_text(annotations[n]), names) for n in cls._fields}
            cls._kinds_cache = kinds
        return kinds


def _plain(value):
    if isinstance(value, Record):
        return value.to_plain()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _text(annotation) -> str:
    """A field's annotation as its text: a plain class by its name."""
    return annotation if isinstance(annotation, str) else annotation.__name__


def _kind(annotation: str, names: dict) -> tuple:
    """(what, inner, optional) of an annotation string: what is "record" (inner: its class),
    "tuple" (inner: the items' kind) or "value" (inner: the plain types it may be, None for
    any); optional when it ends in `| None`."""
    text = annotation.strip()
    optional = text.endswith(" | None")
    if optional:
        text = text[: -len(" | None")].strip()
    if text.startswith("tuple[") and text.endswith("]"):
        inner = text[len("tuple[") : -1]
        item = inner[: -len(", ...")] if inner.endswith(", ...") else None
        return ("tuple", _kind(item, names) if item is not None else ("value", None, True), optional)
    found = names.get(text)
    if isinstance(found, type) and issubclass(found, Record):
        return ("record", found, optional)
    return ("value", _PLAIN.get(text), optional)


# the plain types an annotation may name, as JSON gives them back (None: anything)
_PLAIN = {"str": (str,), "int": (int,), "bool": (bool,), "float": (float, int)}


def _rebuild(kind: tuple, value):
    what, inner, optional = kind
    if value is None:
        if not optional and not (what == "value" and inner is None):
            raise TypeError("null where a value is wanted")
        return None
    if what == "record":
        return inner.from_plain(value)
    if what == "tuple":
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        if inner[0] == "value" and inner[1] is None:  # tuple[tuple[str, str], ...] and the like
            return tuple(_tupled(v) for v in value)
        return tuple(_rebuild(inner, v) for v in value)
    if inner is not None and (not isinstance(value, inner) or (bool not in inner and isinstance(value, bool))):
        raise TypeError(f"expected {inner[0].__name__}, got {type(value).__name__}")
    return value


def _tupled(value):
    """JSON lists as tuples, all the way down (a record's tuple fields hold tuples)."""
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value
