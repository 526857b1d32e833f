"""Import stubbing for the vLLM stand-in: the host's REAL drafter files run, everything they
import that the stand-in does not run (torch, triton, numpy, and every vLLM module outside the
drafter/speculator packages and envs.py) is an absorbing stub.

The stubs are the common ones (fleetpatch_standin_common.stubs) of the ``ValueStub`` family, which
vLLM's drafters need: unpacking a stub gives as many stubs as the code unpacks, a stub equals
any concrete value and compares as a large positive number (the drafters' shape asserts hold),
and a function under a stubbed decorator still runs, except under numba's or triton's. This
module gives the rules (``rules``) and what only vLLM needs:

* Every ``vllm.*`` module is a stub EXCEPT the ones in ``REAL`` (the drafters of Model Runner V1,
  the speculators of V2, ``vllm.envs``): those are imported from the host's files by the normal
  path finder, so fleetpatch's probe (first in ``sys.meta_path``) sees and watches them. A module
  neither on disk nor stubbed is an ImportError, as on a host without it.
* A stubbed vLLM package carries the real directory as ``__path__``, so its real children are
  found there.
* The rules' ``module_attrs`` and ``concrete_names`` hold the few names whose value matters
  (``init_logger``, ``resolve_obj_by_qualname``, ...); ``host.set_up`` fills them before the
  first import.
* ``Off`` (a setting the launch did not give), ``LeadingNone`` and ``absorbing`` (a real class
  whose missing attributes are stubs).

Stdlib only; Python 3.8+.
"""
import os
import sys

from fleetpatch_standin_common.stubs import (
    StubMeta, StubRules, ValueStub, install_stubs, is_dunder, unpacked_count,
)

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

# Calls of `is_*`, `has_*`, `supports_*`, `use_*` helpers return False (not ROCm, not TPU, ...)
# except these (the CUDA path).
FALSE_PREFIXES = ("is_", "_is_", "has_", "supports_", "use_")
TRUE_PREDICATES = {"is_cuda", "is_cuda_alike", "is_available", "is_initialized", "is_last_rank",
                   "is_first_rank", "is_pin_memory_available"}


def is_real(fullname):
    return any(fullname == p or fullname.startswith(p + ".") for p in REAL)


def stubbed_vllm(fullname):
    """A vLLM module the stand-in serves as a stub: any outside REAL."""
    return fullname.split(".", 1)[0] == "vllm" and not is_real(fullname)


def rules(site_dir):
    """The vLLM stand-in's StubRules for the install in `site_dir`: FORCE_STUB and every vLLM
    module outside REAL stubbed (as ValueStubs), nothing else; a stubbed vLLM package's real
    directory as its ``__path__``. Its module_attrs and concrete_names are for the caller to fill."""

    def package_path(fullname):
        real_dir = os.path.join(site_dir, *fullname.split("."))
        return [real_dir] if fullname.startswith("vllm") and os.path.isdir(real_dir) else []

    return StubRules(force_stub=FORCE_STUB, also_stub=stubbed_vllm, true_predicates=TRUE_PREDICATES,
                     false_prefixes=FALSE_PREFIXES, stub_type=ValueStub, stub_missing=False,
                     package_path=package_path)


class Off(ValueStub):
    """A setting the launch did not give: false, but still absorbs calls and attributes."""

    def __bool__(self):
        return False


class LeadingNone(ValueStub):
    """A result unpacked as (what is off, values...): its first value is None
    (`ubatch_slices, n = ...` in 0.12, `should_ubatch, n, _ = ...` later)."""

    def __iter__(self):
        n = unpacked_count(sys._getframe(1))
        return iter([None] + [ValueStub("%s[%d]" % (self._stub_name, i)) for i in range(1, n)])


def absorbing(cls):
    """A subclass of a REAL class whose instances answer a missing attribute with a stub (what
    the real runner would have set up: the loaded draft model, attention groups, ...).  Every
    method stays the real one, from the host's file."""
    if isinstance(cls, StubMeta):
        return cls

    def __getattr__(self, attr):
        if is_dunder(attr):
            raise AttributeError(attr)
        return ValueStub(cls.__name__ + "." + attr)

    return type(cls.__name__, (cls,), {"__getattr__": __getattr__, "__module__": cls.__module__,
                                        "__qualname__": cls.__qualname__})


def install(stub_rules):
    """Put the stub finder first (fleetpatch's probe, when it runs, inserts itself before it is
    consulted only for the REAL modules, which this finder passes on)."""
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    install_stubs(stub_rules)
