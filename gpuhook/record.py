"""Record: an immutable tuple with named fields, for the small types of the pipeline.

collections.namedtuple builds each class with exec(), about a millisecond a class on a slow
node; typing.NamedTuple and dataclasses cost more to import. These types are on the path of
every container start, so they are built from this one plain base class instead.

    class Node(Record, fields="path type major minor present", defaults=(True,)):
        __slots__ = ()
"""


class Record(tuple):
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict = {}

    def __init_subclass__(cls, fields: str = "", defaults: tuple = (), **kw) -> None:
        super().__init_subclass__(**kw)
        names = tuple(fields.split())
        if len(defaults) > len(names):
            raise TypeError(f"{cls.__name__}: more defaults than fields")
        cls._fields = names
        cls._defaults = dict(zip(names[len(names) - len(defaults):], defaults))
        for i, name in enumerate(names):
            setattr(cls, name, property(lambda self, _i=i: tuple.__getitem__(self, _i), doc=f"field {i}: {name}"))

    def __new__(cls, *args, **kwargs):
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__} takes {len(fields)} fields, got {len(args)}")
        values = list(args)
        for name in fields[len(args):]:
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
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(self._fields, self))
        return f"{type(self).__name__}({inner})"

    def _asdict(self) -> dict:
        return dict(zip(self._fields, self))

    def _replace(self, **changes):
        return type(self)(**{**self._asdict(), **changes})
