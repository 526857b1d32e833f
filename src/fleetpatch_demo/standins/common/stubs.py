"""Import stubs: what a stand-in serves for the modules a host lacks (torch, triton, ...).

A host holds an engine's real source tree but none of its GPU/ML dependencies. Two
``StubFinder`` instances on ``sys.meta_path`` serve a ``StubModule`` instead: one in
front for the packages that are always stubbed, even when installed (the rules'
``force_stub``, plus what ``also_stub(fullname)`` claims); one at the end for any module
not on disk (never for the stdlib, ``_``-prefixed C accelerators, or the rules'
``never_stub`` packages, whose missing modules stay genuine ImportErrors), unless the
rules say ``stub_missing=False`` (then a module not on disk is an ImportError). A stubbed
package's ``__path__`` is the rules' ``package_path(fullname)`` (none by default), so that
real children of a stubbed package can be found on disk.

A stub module's attributes are ``Stub`` values: usable as value, callable, decorator,
base class (a class derived from one gets ``StubBase``/``StubMeta``: missing attributes
are stubs and ``__init__`` is a no-op, so a subclass's own ``__init__`` runs unchanged),
context manager, container, number. Names whose values matter come from the rules:
``concrete`` (a name means the same wherever a stub provides it) and ``module_attrs``
(``{module: {name: value}}``); a call of a stub named with one of the rules'
``false_prefixes`` (``is_*`` by default) returns False except the rules' ``true_predicates``.

Two families of stubs, each a stub class and the base of the classes derived from its stubs;
a stub hands out stubs of its own family (the rules' ``stub_type`` says which family a
stubbed module holds):

* ``Stub``/``StubBase``: inert. Iterating one gives nothing, it equals only itself, and a
  function under a stubbed decorator is kept as it is.
* ``ValueStub``/``ValueStubBase``: for real code that computes with what it is handed and
  asserts on it (vLLM's drafters): unpacking one gives as many stubs as the code unpacks,
  it equals any concrete value and compares as a large positive number, a function under a
  stubbed decorator runs as a ``Decorated`` (under numba's or triton's it is compiled code: a
  stub), and a concrete name comes from a stubbed module only, never from a stub's attribute.

Public: ``StubRules``, ``install_stubs(rules)``, ``active_rules()``, ``Stub``,
``StubMeta``, ``StubBase``, ``ValueStub``, ``ValueStubBase``, ``Decorated``, ``StubModule``,
``StubFinder``, ``make_stub_class``, ``unpacked_count``, ``MISSING``, ``is_dunder``,
``name_leaf``, ``is_stdlib``. One engine's rules per process: ``install_stubs`` makes them
the ones every stub consults, and each stubbed module keeps the rules of the finder that made it.

Stdlib only; Python 3.8+.
"""
import dis
import importlib.abc
import importlib.machinery
import inspect
import sys
import types

MISSING = object()
COMPILERS = ("numba", "triton")     # their decorators compile the function: it never runs as Python


class StubRules(object):
    """What an engine's stand-in tells the stubs (see the module docstring)."""

    def __init__(self, force_stub=(), never_stub=(), true_predicates=(), concrete=None,
                 module_attrs=None, also_stub=None, false_prefixes=("is_", "_is_"), stub_type=None,
                 stub_missing=True, package_path=None):
        self.force_stub = tuple(force_stub)
        self.never_stub = tuple(never_stub)
        self.true_predicates = frozenset(true_predicates)
        self.false_prefixes = tuple(false_prefixes)
        self.concrete_names = concrete if concrete is not None else {}
        self.module_attrs = module_attrs if module_attrs is not None else {}
        self.also_stub = also_stub or (lambda fullname: False)
        self.stub_type = stub_type          # the family of a stubbed module's stubs; None: Stub
        self.stub_missing = stub_missing    # the finder at the end: a stub for any module not on disk
        self.package_path = package_path or (lambda fullname: [])

    def concrete(self, name):
        """The concrete value of `name`, or MISSING."""
        return self.concrete_names.get(name, MISSING)


_ACTIVE = {"rules": StubRules()}


def active_rules():
    """The StubRules that install_stubs installed (empty ones before)."""
    return _ACTIVE["rules"]


def install_stubs(rules):
    """Make `rules` the process's and put the finders on sys.meta_path (once)."""
    _ACTIVE["rules"] = rules
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StubFinder(rules, force=True))
        if rules.stub_missing:
            sys.meta_path.append(StubFinder(rules, force=False))


def concrete_name(attr):
    """The active rules' concrete value of `attr`, or MISSING (how a `Stub` family looks a name up)."""
    return active_rules().concrete(attr)


def no_concrete_name(attr):
    """MISSING: how a `ValueStub` family looks a name up (concrete names come from modules only)."""
    return MISSING


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

    # its family (class attributes, set once both classes exist): the stubs it hands out, the
    # base of a class derived from it, and where a missing attribute's concrete value comes from
    _stub_type = None
    _base_type = None
    _concrete = staticmethod(concrete_name)

    def __init__(self, name="stub"):
        object.__setattr__(self, "_stub_name", name)

    # attribute access -----------------------------------------------------
    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = self._concrete(attr)
        if value is MISSING:
            value = self._stub_type(self._stub_name + "." + attr)
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
        rules = active_rules()
        leaf = name_leaf(self._stub_name)
        if leaf in rules.true_predicates:
            return True
        if leaf.startswith(rules.false_prefixes):
            return False
        if len(args) == 1 and not kwargs and (
            inspect.isfunction(args[0]) or inspect.isclass(args[0]) or inspect.ismethod(args[0])
            or isinstance(args[0], (staticmethod, classmethod, property, Decorated))
        ):
            return self._decorated(args[0])  # used as a decorator
        return self._stub_type(self._stub_name + "()")

    def _decorated(self, target):
        """What this stub used as a decorator makes of `target`: the real function or class, kept."""
        return target

    # base class -----------------------------------------------------------
    def __mro_entries__(self, bases):
        cls = self.__dict__.get("_stub_class")
        if cls is None:
            cls = make_stub_class(self._stub_name, self._base_type)
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
        return self._stub_type(self._stub_name + "[]")

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
    """Metaclass of classes derived from stubs: missing class attributes are stubs (of the family
    of the class's stub base)."""

    def __getattr__(cls, attr):
        if is_dunder(attr) or attr.startswith("_abc"):
            raise AttributeError(attr)
        value = cls._concrete(attr)
        if value is MISSING:
            value = cls._stub_type(cls.__name__ + "." + attr)
        type.__setattr__(cls, attr, value)
        return value


class StubBase(object, metaclass=StubMeta):
    """Base of every class made from a stub: __init__ is a no-op and missing
    attributes are stubs, so a subclass's own real __init__ runs unchanged."""

    _stub_type = Stub        # the family of its missing attributes' stubs
    _concrete = staticmethod(concrete_name)

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = self._concrete(attr)
        if value is MISSING:
            value = self._stub_type(type(self).__name__ + "." + attr)
        try:
            object.__setattr__(self, attr, value)
        except Exception:
            pass
        return value

    def __call__(self, *args, **kwargs):
        return self._stub_type(type(self).__name__ + "()")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


Stub._stub_type, Stub._base_type = Stub, StubBase


class ValueStub(Stub):
    """A stub that real code computes with and asserts on (vLLM's drafters): unpacking it gives
    as many stubs as the code unpacks (``a, b = self.model(...)``); it equals any concrete value
    and compares as a large positive number, so shape asserts hold, while two different stubs (two
    enum members) differ; a function under a stubbed decorator still runs (``Decorated``), except
    under numba's or triton's, which compile it; its attributes are stubs, never concrete names;
    ``dataclasses.replace(stub, x=...)`` gives a stub."""

    __dataclass_fields__ = {}
    _concrete = staticmethod(no_concrete_name)

    def __init__(self, name="stub", **ignored):
        Stub.__init__(self, name)

    def _decorated(self, target):
        if inspect.isfunction(target) or inspect.ismethod(target):
            if self._stub_name.split(".", 1)[0] in COMPILERS:
                # numba.jit / triton.jit: compiled code, no Python line of it runs
                return self._stub_type("%s(%s)" % (self._stub_name, target.__name__))
            return Decorated(target)   # a decorator: the real function runs
        return target

    def __instancecheck__(self, obj):
        # a stub value is an instance of any stubbed type (the metadata, the model, ...)
        return isinstance(obj, (Stub, StubBase)) or Stub.__instancecheck__(self, obj)

    def __iter__(self):
        n = unpacked_count(sys._getframe(1))
        return iter([self._stub_type("%s[%d]" % (self._stub_name, i)) for i in range(n)])

    # equal to itself and to any concrete value (`hidden_states.shape[-1] == self.hidden_size`
    # holds); two different stubs differ (`mode == CUDAGraphMode.NONE` does not)
    def __eq__(self, other):
        return self is other or not isinstance(other, (Stub, StubBase, type(None)))

    def __ne__(self, other):
        return not self.__eq__(other)

    # a stub compares as a large positive number: `n > 0` holds, `n < limit` does not
    def __lt__(self, other):
        return False

    __le__ = __lt__

    def __gt__(self, other):
        return True

    __ge__ = __gt__
    __hash__ = Stub.__hash__

    def __format__(self, spec):
        return str(self)


class ValueStubBase(StubBase):
    """Base of every class made from a `ValueStub`: its missing attributes are `ValueStub` values."""

    _stub_type = ValueStub
    _concrete = staticmethod(no_concrete_name)


ValueStub._stub_type, ValueStub._base_type = ValueStub, ValueStubBase


def unpacked_count(frame):
    """How many values the caller unpacks from what it iterates (`a, b = stub()`): the count of
    the UNPACK_SEQUENCE / UNPACK_EX at the frame's current instruction; 0 for a loop."""
    try:
        for ins in dis.get_instructions(frame.f_code):
            if ins.offset == frame.f_lasti:
                if ins.opname == "UNPACK_SEQUENCE":
                    return ins.arg
                if ins.opname == "UNPACK_EX":
                    return (ins.arg & 0xFF) + (ins.arg >> 8)
                return 0
    except Exception:
        pass
    return 0


class Decorated(object):
    """A real function under a stubbed decorator (``@torch.inference_mode()``, a kernel
    registry, ...) of a `ValueStub`: calling it runs the real function; attributes the decorator
    would have added (``register_warmup``, ...) are stubs."""

    def __init__(self, func):
        self.__wrapped__ = func
        self.__name__ = getattr(func, "__name__", "decorated")
        self.__qualname__ = getattr(func, "__qualname__", self.__name__)
        self.__doc__ = getattr(func, "__doc__", None)
        self.__module__ = getattr(func, "__module__", None)

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def __getitem__(self, grid):
        # a Triton kernel launch (`kernel[grid](...)`): GPU code, a stub here
        return ValueStub(self.__name__ + "[]")

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        return self.__wrapped__.__get__(obj, cls)

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        return ValueStub(self.__name__ + "." + attr)


def make_stub_class(name, base=StubBase):
    """A class for a stub used as a base class: `base` (its family's) with the stub's last name."""
    leaf = name_leaf(name) or "Stub"
    if not leaf.isidentifier():
        leaf = "Stub"
    module = name.rsplit(".", 1)[0] if "." in name else name
    return StubMeta(leaf, (base,), {"__module__": module, "__qualname__": leaf})


class StubModule(types.ModuleType):
    """A stubbed module: the rules' values for it, then their concrete names, then stubs of the
    rules' family. It keeps the rules of the finder that made it."""

    _fleetpatch_stub_rules = None

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        rules = self._fleetpatch_stub_rules or active_rules()
        value = rules.module_attrs.get(self.__name__, {}).get(attr, MISSING)
        if value is MISSING:
            value = rules.concrete(attr)
        if value is MISSING:
            value = (rules.stub_type or Stub)(self.__name__ + "." + attr)
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
        module = StubModule(spec.name)
        module._fleetpatch_stub_rules = self.rules
        return module

    def exec_module(self, module):
        module.__path__ = self.rules.package_path(module.__name__)
        module.__all__ = []
        module.__file__ = None
        for key, value in self.rules.module_attrs.get(module.__name__, {}).items():
            setattr(module, key, value)
