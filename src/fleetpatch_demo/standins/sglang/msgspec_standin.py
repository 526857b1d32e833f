"""msgspec as the stand-in serves it (0.5.20+: ServerArgs is a msgspec Struct; msgspec is
not installed on a stand-in host). ``MSGSPEC`` and ``MSGSPEC_STRUCTS`` are the attributes of
the stub modules ``msgspec`` and ``msgspec.structs``."""


class _NoDefault(object):
    def __repr__(self):
        return "NODEFAULT"

    def __bool__(self):
        return False


NODEFAULT = _NoDefault()


class _FieldDefault(object):
    """What msgspec.field(...) returns: a default, or a factory for one."""

    def __init__(self, default=NODEFAULT, default_factory=NODEFAULT, name=None):
        if default is not NODEFAULT and default_factory is not NODEFAULT:
            raise TypeError("Cannot set both `default` and `default_factory`")
        self.default, self.default_factory, self.name = default, default_factory, name


def msgspec_field(default=NODEFAULT, default_factory=NODEFAULT, name=None):
    return _FieldDefault(default, default_factory, name)


class FieldInfo(object):
    """msgspec.structs.FieldInfo."""

    def __init__(self, name, type_, default, default_factory):
        self.name, self.encode_name, self.type = name, name, type_
        self.default, self.default_factory = default, default_factory

    @property
    def required(self):
        return self.default is NODEFAULT and self.default_factory is NODEFAULT

    def __repr__(self):
        return "FieldInfo(name=%r, type=%r, default=%r, default_factory=%r)" % (
            self.name, self.type, self.default, self.default_factory)


def _is_classvar(annotation):
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


class _StructMeta(type):
    """Collects a Struct's fields (its bases' first) and its class keywords."""

    def __new__(mcls, name, bases, namespace, **config):
        own = {}
        for field_name, annotation in namespace.get("__annotations__", {}).items():
            if _is_classvar(annotation):
                continue
            value = namespace.pop(field_name, NODEFAULT)
            if isinstance(value, _FieldDefault):
                own[field_name] = (annotation, value.default, value.default_factory)
            else:
                own[field_name] = (annotation, value, NODEFAULT)
        cls = super(_StructMeta, mcls).__new__(mcls, name, bases, namespace)
        fields, merged = {}, {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(base.__dict__.get("_standin_fields", {}))
            merged.update(base.__dict__.get("__struct_config__", {}))
        fields.update(own)
        merged.update(config)
        cls._standin_fields = fields
        cls.__struct_config__ = merged
        cls.__struct_fields__ = tuple(fields)
        if merged.get("frozen"):
            cls.__hash__ = _Struct_hash
        return cls

    def __init__(cls, name, bases, namespace, **config):
        super(_StructMeta, cls).__init__(name, bases, namespace)


def _Struct_hash(self):
    return hash((type(self),) + tuple(getattr(self, n) for n in self.__struct_fields__))


class Struct(object, metaclass=_StructMeta):
    """msgspec.Struct: keyword or positional construction, defaults (empty
    mutable defaults copied per instance), __post_init__, repr, eq, frozen."""

    def __init__(self, *args, **kwargs):
        names = self.__struct_fields__
        if len(args) > len(names):
            raise TypeError("Extra positional arguments provided")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in self._standin_fields:
                raise TypeError("Unexpected keyword argument '%s'" % key)
            if key in values:
                raise TypeError("Argument '%s' given by name and position" % key)
            values[key] = value
        for key in names:
            if key not in values:
                _, default, factory = self._standin_fields[key]
                if factory is not NODEFAULT:
                    values[key] = factory()
                elif default is NODEFAULT:
                    raise TypeError("Missing required argument '%s'" % key)
                else:
                    values[key] = type(default)() if isinstance(default, (list, dict, set)) and not default else default
            object.__setattr__(self, key, values[key])
        post_init = getattr(type(self), "__post_init__", None)
        if post_init is not None:
            post_init(self)

    def __setattr__(self, name, value):
        if type(self).__struct_config__.get("frozen"):
            raise AttributeError("immutable type: '%s'" % type(self).__name__)
        object.__setattr__(self, name, value)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (n, getattr(self, n, None)) for n in self.__struct_fields__))

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__struct_fields__)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None

    def __copy__(self):
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new


def defstruct(name, fields, bases=None, module=None, namespace=None, **config):
    """msgspec.defstruct: a Struct class from (name[, type[, default]]) entries."""
    body = dict(namespace or {})
    annotations = {}
    for entry in fields:
        entry = (entry,) if isinstance(entry, str) else tuple(entry)
        annotations[entry[0]] = entry[1] if len(entry) > 1 else object
        if len(entry) > 2:
            body[entry[0]] = entry[2]
    body["__annotations__"] = annotations
    if module is not None:
        body["__module__"] = module
    body.setdefault("__qualname__", name)
    return _StructMeta(name, tuple(bases or (Struct,)), body, **config)


def _struct_type(obj):
    return obj if isinstance(obj, type) else type(obj)


def struct_fields(obj):
    """msgspec.structs.fields: types resolved like msgspec (get_type_hints)."""
    cls = _struct_type(obj)
    import typing
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:
        hints = {}
    return tuple(FieldInfo(n, hints.get(n, ann), default, factory)
                 for n, (ann, default, factory) in cls._standin_fields.items())


def struct_asdict(obj):
    return dict((n, getattr(obj, n)) for n in obj.__struct_fields__)


def struct_astuple(obj):
    return tuple(getattr(obj, n) for n in obj.__struct_fields__)


def struct_replace(obj, **changes):
    new = obj.__copy__()
    for key, value in changes.items():
        if key not in obj._standin_fields:
            raise TypeError("`%s` has no field '%s'" % (type(obj).__name__, key))
        object.__setattr__(new, key, value)
    return new


MSGSPEC_STRUCTS = {"fields": struct_fields, "asdict": struct_asdict, "astuple": struct_astuple,
                    "replace": struct_replace, "FieldInfo": FieldInfo}


MSGSPEC = {"Struct": Struct, "field": msgspec_field, "NODEFAULT": NODEFAULT,
            "defstruct": defstruct}
