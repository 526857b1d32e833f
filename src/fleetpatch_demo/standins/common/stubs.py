"""Import stubs: what a stand-in serves for the modules a host lacks (torch, triton, ...).

A host holds an engine's real source tree but none of its GPU/ML dependencies. Two
``StubFinder`` instances on ``sys.meta_path`` serve a ``StubModule`` instead: one in
front for the packages that are always stubbed, even when installed (the rules'
``force_stub``, plus what ``also_stub(fullname)`` claims); one at the end for any module
not on disk (never for the stdlib, ``_``-prefixed C accelerators, or the rules'
``never_stub`` packages, whose missing modules stay genuine ImportErrors).

A stub module's attributes are ``Stub`` values: usable as value, callable, decorator,
base class (a class derived from one gets ``StubBase``/``StubMeta``: missing attributes
are stubs and ``__init__`` is a no-op, so a subclass's own ``__init__`` runs unchanged),
context manager, container, number. Names whose values matter come from the rules:
``concrete`` (a name means the same wherever a stub provides it) and ``module_attrs``
(``{module: {name: value}}``); a call of an ``is_*`` stub returns False except the
rules' ``true_predicates``.

Public: ``StubRules``, ``install_stubs(rules)``, ``active_rules()``, ``Stub``,
``StubMeta``, ``StubBase``, ``StubModule``, ``StubFinder``, ``make_stub_class``,
``MISSING``, ``is_dunder``, ``name_leaf``, ``is_stdlib``. One engine's rules per process:
``install_stubs`` makes them the ones every stub consults.

Stdlib only; Python 3.8+.
"""
import importlib.abc
import importlib.machinery
import inspect
import sys
import types

MISSING = object()


class StubRules(object):
    """What an engine's stand-in tells the stubs (see the module docstring)."""

    def __init__(self, force_stub=(), never_stub=(), true_predicates=(), concrete=None,
                 module_attrs=None, also_stub=None):
        self.force_stub = tuple(force_stub)
        self.never_stub = tuple(never_stub)
        self.true_predicates = frozenset(true_predicates)
        self.concrete_names = concrete if concrete is not None else {}
        self.module_attrs = module_attrs if module_attrs is not None else {}
        self.also_stub = also_stub or (lambda fullname: False)

    def concrete(self, name):
        """The concrete value of `name`, or MISSING."""
        return self.concrete_names.get(name, MISSING)


_ACTIVE = {"rules": StubRules()}


def active_rules():
    """The StubRules that install_stubs installed (empty ones before)."""
    return _ACTIVE["rules"]


def install_stubs(rules):
    """Make `rules` the process's and put the two finders on sys.meta_path (once)."""
    _ACTIVE["rules"] = rules
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StubFinder(rules, force=True))
        sys.meta_path.append(StubFinder(rules, force=False))


def is_dunder(name):
    return name.startswith("__") and name.endswith("__")


def name_leaf(name):
    """The last part of a stub's dotted name, without call or index marks."""
    return name.rsplit(".", 1)[-1].split("(")[0].split("[")[0]


def is_stdlib(top):
    # A stub for a platform module of the stdlib (msvcrt, _winapi, ...) would make
    # the stdlib take its other platform's branch: subprocess imports msvcrt to
    # decide whether it runs on Windows.
    names = getattr(sys, "stdlib_module_names", None)
    return names is not None and top in names


class Stub(object):
    """Anything a missing module provides: usable as value, callable,
    decorator, base class, context manager, container, number, enum member."""

    def __init__(self, name="stub"):
        object.__setattr__(self, "_stub_name", name)

    # attribute access -----------------------------------------------------
    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = active_rules().concrete(attr)
        if value is MISSING:
            value = Stub(self._stub_name + "." + attr)
        object.__setattr__(self, attr, value)
        return value

    def __setattr__(self, attr, value):
        object.__setattr__(self, attr, value)

    def __delattr__(self, attr):
        try:
            object.__delattr__(self, attr)
        except AttributeError:
            pass

    # calls, decorators ----------------------------------------------------
    def __call__(self, *args, **kwargs):
        leaf = name_leaf(self._stub_name)
        if leaf in active_rules().true_predicates:
            return True
        if leaf.startswith(("is_", "_is_")):
            return False
        if len(args) == 1 and not kwargs and (
            inspect.isfunction(args[0]) or inspect.isclass(args[0])
            or inspect.ismethod(args[0]) or isinstance(args[0], (staticmethod, classmethod, property))
        ):
            return args[0]  # used as a decorator: keep the real function/class
        return Stub(self._stub_name + "()")

    # base class -----------------------------------------------------------
    def __mro_entries__(self, bases):
        cls = self.__dict__.get("_stub_class")
        if cls is None:
            cls = make_stub_class(self._stub_name)
            object.__setattr__(self, "_stub_class", cls)
        return (cls,)

    def __instancecheck__(self, obj):
        cls = self.__dict__.get("_stub_class")
        return cls is not None and isinstance(obj, cls)

    def __subclasscheck__(self, sub):
        cls = self.__dict__.get("_stub_class")
        return cls is not None and isinstance(sub, type) and issubclass(sub, cls)

    # containers -----------------------------------------------------------
    def __getitem__(self, key):
        return Stub(self._stub_name + "[]")

    def __setitem__(self, key, value):
        pass

    def __delitem__(self, key):
        pass

    def __iter__(self):
        return iter(())

    def __reversed__(self):
        return iter(())

    def __len__(self):
        return 0

    def __contains__(self, item):
        return False

    def __bool__(self):
        return True

    # context managers -----------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    # comparisons ----------------------------------------------------------
    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __hash__(self):
        return id(self)

    # numbers --------------------------------------------------------------
    def _same(self, *args):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _same
    __mod__ = __rmod__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = _same
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _same
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _same
    __neg__ = __pos__ = __abs__ = __invert__ = _same

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __float__(self):
        return 0.0

    def __complex__(self):
        return 0j

    def __round__(self, n=None):
        return 0

    __trunc__ = __floor__ = __ceil__ = __round__

    def __format__(self, spec):
        if not spec:
            return str(self)
        for zero in (0, 0.0):
            try:
                return format(zero, spec)
            except (ValueError, TypeError):
                pass
        return str(self)

    def __repr__(self):
        return "<stub %s>" % self._stub_name

    __str__ = __repr__

    def __fspath__(self):
        return "/nonexistent/" + self._stub_name


class StubMeta(type(__import__("abc").ABC)):
    """Metaclass of classes derived from stubs: missing class attributes are stubs."""

    def __getattr__(cls, attr):
        if is_dunder(attr) or attr.startswith("_abc"):
            raise AttributeError(attr)
        value = active_rules().concrete(attr)
        if value is MISSING:
            value = Stub(cls.__name__ + "." + attr)
        type.__setattr__(cls, attr, value)
        return value


class StubBase(object, metaclass=StubMeta):
    """Base of every class made from a stub: __init__ is a no-op and missing
    attributes are stubs, so a subclass's own real __init__ runs unchanged."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = active_rules().concrete(attr)
        if value is MISSING:
            value = Stub(type(self).__name__ + "." + attr)
        try:
            object.__setattr__(self, attr, value)
        except Exception:
            pass
        return value

    def __call__(self, *args, **kwargs):
        return Stub(type(self).__name__ + "()")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_stub_class(name):
    leaf = name_leaf(name) or "Stub"
    if not leaf.isidentifier():
        leaf = "Stub"
    module = name.rsplit(".", 1)[0] if "." in name else name
    return StubMeta(leaf, (StubBase,), {"__module__": module, "__qualname__": leaf})


class StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = active_rules().module_attrs.get(self.__name__, {}).get(attr, MISSING)
        if value is MISSING:
            value = active_rules().concrete(attr)
        if value is MISSING:
            value = Stub(self.__name__ + "." + attr)
        setattr(self, attr, value)
        return value


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a StubModule for a module that is not on disk.

    Appended to the end of sys.meta_path (so real files are found first); a
    second instance in front serves the rules' force_stub packages."""

    def __init__(self, rules, force):
        self.rules = rules
        self.force = force

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".", 1)[0]
        if self.force:
            if top not in self.rules.force_stub and not self.rules.also_stub(fullname):
                return None
        else:
            if top.startswith("_") or is_stdlib(top):
                return None  # C accelerators etc.: keep stdlib's ImportError fallbacks
            for prefix in self.rules.never_stub:
                if fullname.startswith(prefix + "."):
                    return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__all__ = []
        module.__file__ = None
        for key, value in active_rules().module_attrs.get(module.__name__, {}).items():
            setattr(module, key, value)
