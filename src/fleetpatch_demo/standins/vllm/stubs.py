"""Import stubbing for the vLLM stand-in: the host's REAL drafter files run, everything they
import that the stand-in does not run (torch, triton, numpy, and every vLLM module outside the
drafter/speculator packages and envs.py) is an absorbing stub.

The idea is the common stubs' (fleetpatch_standin_common.stubs, whose helpers this module
uses): a stub is usable as a value, a
callable, a decorator, a base class, a context manager, a container and a number, so real code
that only passes tensors and configs along runs line by line.  vLLM's drafters need other semantics than SGLang's workers, hence
a finder and Stub of its own:

* unpacking a stub gives as many stubs as the code unpacks (``a, b = self.model(...)``);
* a stub equals any concrete value and compares as a large positive number, so the drafters'
  shape asserts hold, while two different stubs (two enum members) differ;
* a function under a stubbed decorator still runs (``Decorated``), except under numba's or
  triton's, which compile it (their Python never runs, in vLLM either);

* Every ``vllm.*`` module is a stub EXCEPT the ones in ``REAL`` (the drafters of Model Runner V1,
  the speculators of V2, ``vllm.envs``): those are imported from the host's files by the normal
  path finder, so fleetpatch's probe (first in ``sys.meta_path``) sees and watches them.
* A stubbed vLLM package carries the real directory as ``__path__``, so its real children are
  found there.
* ``CONCRETE`` holds the few names whose value matters (``init_logger``,
  ``resolve_obj_by_qualname``, ...); ``main`` fills it before the first import.

Stdlib only; Python 3.8+.
"""
import dis
import importlib
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import types

from fleetpatch_standin_common.stubs import MISSING, is_dunder, name_leaf

FORCE_STUB = (
    "torch", "triton", "numpy", "transformers", "flashinfer", "xformers", "vllm_flash_attn",
    "cuda", "pynvml", "safetensors", "huggingface_hub", "tokenizers", "msgspec", "zmq", "uvloop",
    "uvicorn", "fastapi", "pydantic", "psutil", "setproctitle", "einops", "cv2", "PIL", "ray",
    "compressed_tensors", "gguf", "xgrammar", "outlines", "llguidance", "openai", "prometheus_client",
    "cbor2", "blake3", "regex", "cachetools", "aiohttp", "requests", "deep_gemm", "deep_ep",
    "flash_attn", "pplx_kernels", "lm_format_enforcer", "mistral_common", "tiktoken", "sentencepiece",
    "partial_json_parser", "opentelemetry", "scipy", "numba", "tqdm", "typing_extensions", "pybase64",
    "ijson", "starlette", "sse_starlette", "watchfiles", "depyf", "nixl", "quack", "cutlass", "tilelang",
    "helion", "apache_tvm_ffi", "tvm_ffi", "torchvision", "torchaudio", "amdsmi", "intel_extension_for_pytorch",
)

# vLLM modules that run for real from the host's files (a prefix covers the package and below).
REAL = (
    "vllm.envs",
    "vllm.v1.spec_decode",
    "vllm.v1.worker.gpu.spec_decode",
)

# Calls of `is_*` helpers return False (not ROCm, not TPU, ...) except these (the CUDA path).
TRUE_PREDICATES = {"is_cuda", "is_cuda_alike", "is_available", "is_initialized", "is_last_rank",
                   "is_first_rank", "is_pin_memory_available"}

COMPILERS = ("numba", "triton")     # their decorators compile the function: it never runs as Python


class Registry(object):
    """The concrete values stubs hand out: {module: {name: value}} and {name: value} for any module.
    One object per process, passed to the finder (no module global)."""

    def __init__(self, site_dir):
        self.site_dir = site_dir
        self.by_module = {}
        self.by_name = {}

    def concrete(self, module, name):
        value = self.by_module.get(module, {}).get(name, MISSING)
        return self.by_name.get(name, MISSING) if value is MISSING else value


class Stub(object):
    """Anything a stubbed module provides."""

    __dataclass_fields__ = {}     # dataclasses.replace(stub, x=...) gives a stub

    def __init__(self, name="stub", **ignored):
        object.__setattr__(self, "_stub_name", name)

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = Stub(self._stub_name + "." + attr)
        object.__setattr__(self, attr, value)
        return value

    def __setattr__(self, attr, value):
        object.__setattr__(self, attr, value)

    def __call__(self, *args, **kwargs):
        leaf = name_leaf(self._stub_name)
        if leaf in TRUE_PREDICATES:
            return True
        if leaf.startswith(("is_", "_is_", "has_", "supports_", "use_")):
            return False
        if len(args) == 1 and not kwargs:
            if inspect.isfunction(args[0]) or inspect.ismethod(args[0]):
                if self._stub_name.split(".", 1)[0] in COMPILERS:
                    # numba.jit / triton.jit: compiled code, no Python line of it runs
                    return Stub("%s(%s)" % (self._stub_name, args[0].__name__))
                return Decorated(args[0])   # a decorator: the real function runs
            if inspect.isclass(args[0]) or isinstance(args[0], (staticmethod, classmethod, property, Decorated)):
                return args[0]
        return Stub(self._stub_name + "()")

    def __mro_entries__(self, bases):
        cls = self.__dict__.get("_stub_class")
        if cls is None:
            cls = make_stub_class(self._stub_name)
            object.__setattr__(self, "_stub_class", cls)
        return (cls,)

    def __instancecheck__(self, obj):
        # a stub value is an instance of any stubbed type (the metadata, the model, ...)
        cls = self.__dict__.get("_stub_class")
        return isinstance(obj, (Stub, StubBase)) or (cls is not None and isinstance(obj, cls))

    def __subclasscheck__(self, sub):
        cls = self.__dict__.get("_stub_class")
        return cls is not None and isinstance(sub, type) and issubclass(sub, cls)

    def __getitem__(self, key):
        return Stub(self._stub_name + "[]")

    def __setitem__(self, key, value):
        pass

    def __delitem__(self, key):
        pass

    def __iter__(self):
        n = unpacked_count(sys._getframe(1))
        return iter([Stub("%s[%d]" % (self._stub_name, i)) for i in range(n)])

    def __reversed__(self):
        return iter(())

    def __len__(self):
        return 0

    def __contains__(self, item):
        return False

    def __bool__(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

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

    def __hash__(self):
        return id(self)

    def _same(self, *args):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _same
    __mod__ = __rmod__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = _same
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _same
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _same
    __neg__ = __pos__ = __abs__ = __invert__ = _same
    __iadd__ = __isub__ = __imul__ = __itruediv__ = __ifloordiv__ = __ior__ = __iand__ = _same

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __float__(self):
        return 0.0

    def __round__(self, n=None):
        return 0

    __trunc__ = __floor__ = __ceil__ = __round__

    def __format__(self, spec):
        return str(self)

    def __repr__(self):
        return "<stub %s>" % self._stub_name

    __str__ = __repr__


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


class Off(Stub):
    """A setting the launch did not give: false, but still absorbs calls and attributes."""

    def __bool__(self):
        return False


class LeadingNone(Stub):
    """A result unpacked as (what is off, values...): its first value is None
    (`ubatch_slices, n = ...` in 0.12, `should_ubatch, n, _ = ...` later)."""

    def __iter__(self):
        n = unpacked_count(sys._getframe(1))
        return iter([None] + [Stub("%s[%d]" % (self._stub_name, i)) for i in range(1, n)])


class Decorated(object):
    """A real function under a stubbed decorator (``@torch.inference_mode()``, a kernel
    registry, ...): calling it runs the real function; attributes the decorator would have added
    (``register_warmup``, ...) are stubs."""

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
        return Stub(self.__name__ + "[]")

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        return self.__wrapped__.__get__(obj, cls)

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        return Stub(self.__name__ + "." + attr)


class StubMeta(type(__import__("abc").ABC)):
    """Metaclass of classes made from stubs: missing class attributes are stubs."""

    def __getattr__(cls, attr):
        if is_dunder(attr) or attr.startswith("_abc"):
            raise AttributeError(attr)
        value = Stub(cls.__name__ + "." + attr)
        type.__setattr__(cls, attr, value)
        return value


class StubBase(object, metaclass=StubMeta):
    """Base of every class made from a stub: __init__ is a no-op and missing attributes are stubs,
    so a real subclass's own __init__ runs unchanged."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = Stub(type(self).__name__ + "." + attr)
        try:
            object.__setattr__(self, attr, value)
        except Exception:
            pass
        return value

    def __call__(self, *args, **kwargs):
        return Stub(type(self).__name__ + "()")


def make_stub_class(name):
    leaf = name_leaf(name) or "Stub"
    if not leaf.isidentifier():
        leaf = "Stub"
    module = name.rsplit(".", 1)[0] if "." in name else name
    return StubMeta(leaf, (StubBase,), {"__module__": module, "__qualname__": leaf})


def absorbing(cls):
    """A subclass of a REAL class whose instances answer a missing attribute with a stub (what
    the real runner would have set up: the loaded draft model, attention groups, ...).  Every
    method stays the real one, from the host's file."""
    if isinstance(cls, StubMeta):
        return cls

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        return Stub(cls.__name__ + "." + attr)

    return type(cls.__name__, (cls,), {"__getattr__": __getattr__, "__module__": cls.__module__,
                                        "__qualname__": cls.__qualname__})


class StubModule(types.ModuleType):
    registry = None

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        value = self.registry.concrete(self.__name__, attr) if self.registry else MISSING
        if value is MISSING:
            value = Stub(self.__name__ + "." + attr)
        setattr(self, attr, value)
        return value


def is_real(fullname):
    return any(fullname == p or fullname.startswith(p + ".") for p in REAL)


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a StubModule for FORCE_STUB packages and for vLLM modules outside REAL; returns None
    for the REAL ones so the normal path finder (after fleetpatch's probe) loads the host's file."""

    def __init__(self, registry):
        self.registry = registry

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".", 1)[0]
        if top == "vllm":
            if is_real(fullname):
                return None
        elif top not in FORCE_STUB:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.registry = self.registry
        return module

    def exec_module(self, module):
        real_dir = os.path.join(self.registry.site_dir, *module.__name__.split("."))
        module.__path__ = [real_dir] if module.__name__.startswith("vllm") and os.path.isdir(real_dir) else []
        module.__all__ = []
        module.__file__ = None
        for key, value in self.registry.by_module.get(module.__name__, {}).items():
            setattr(module, key, value)


def install(registry):
    """Put the stub finder first (fleetpatch's probe, when it runs, inserts itself before it is
    consulted only for the REAL modules, which this finder passes on)."""
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StubFinder(registry))
