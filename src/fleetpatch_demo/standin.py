"""Stand-in SGLang server: SGLang's real startup path, without torch or a GPU.

This module is copied onto demo/test hosts as ``sglang_standin.py`` in the
host's site-packages (next to a real ``sglang/`` source tree taken from the PyPI
wheel) and started exactly like SGLang::

    <python> -m sglang_standin --model-path /models/x --speculative-algorithm EAGLE3 \\
        --speculative-num-steps 3 --speculative-eagle-topk 4 \\
        --speculative-num-draft-tokens 8 --port 30000 [--tp-size 2] [--host 127.0.0.1]

It accepts the same flags as ``python -m sglang.launch_server`` of the installed
version because it builds the parser with the tree's REAL
``sglang.srt.server_args.ServerArgs.add_cli_args``: a flag that a patch adds to
``server_args.py`` is accepted, an unknown flag is an argparse error (exit 2).

What runs for real (from the host's tree) and what is simulated:

* A ``sys.meta_path`` finder serves permissive stub modules for everything the
  tree does not contain (torch, triton, sgl_kernel, numpy, transformers, and
  every ``sglang.*`` module outside ``server_args.py`` / ``speculative/``).
  GPU/ML libraries (FORCE_STUB) are always stubbed, even if installed. Files
  that exist in the tree are always imported for real; a module missing from
  ``sglang/srt/speculative/`` (which the tree holds completely) is a genuine
  ImportError. A handful of names whose values matter (``envs`` of
  sglang.srt.environ, is_cuda/is_hip/..., get_bool_env_var, nullable_str,
  TpModelWorker, ModelConfig, ...) get concrete stand-ins below.
* ``ServerArgs`` is built from the parsed flags with the tree's own
  ``from_cli_args`` while ``__post_init__`` (hardware probing) is skipped.
  Then the tree's real handlers that the routing depends on run, in
  ``__post_init__`` order (_POST_INIT_STEPS: missing defaults, GPU memory
  settings for an 80 GB GPU, attention backend, page size, pipeline
  parallelism, ``_handle_speculative_decoding``), then the real
  ``check_server_args``. Through 0.5.12 that is where the routing happens:
  NEXTN -> EAGLE, ``SGLANG_ENABLE_SPEC_V2`` -> overlap on/off, the "Overlap
  scheduler is disabled ..." / "Spec v2 is enabled ..." warnings (printed bare
  to stderr because logging is not configured yet, as in SGLang), the
  topk > 1 ValueError, the pp AssertionError. 0.5.13+ moved the speculative
  handling into sglang/srt/arg_groups/ (not in the tree); for those versions
  _handle_speculative_decoding_v2_only replicates it.
* Logging is configured like SGLang (``[%Y-%m-%d %H:%M:%S] message``) and
  ``server_args=ServerArgs(...)`` (the dataclass repr) is logged.
* For each TP rank (``--tp-size``) the draft worker class is chosen by the
  tree's real ``SpeculativeAlgorithm.create_worker`` (0.5.8+) or its registry
  (``create_draft_worker``, 0.5.7), imported from the tree and CONSTRUCTED with
  the scheduler's arguments, so every line of its real ``__init__`` runs
  (including ``logger.info`` calls a patch adds, and any genuine error, which
  is logged as "Scheduler hit an exception: Traceback ..." and exits 1).
  The target ``TpModelWorker`` / ``ModelRunner`` are simulated objects; the
  real draft cuda-graph runners of the tree run (their capture is a stub).
  With tp_size > 1 the log prefix is ``[ts TP<rank>] `` like SGLang's scheduler.
* An HTTP server answers ``GET /health``, ``/health_generate`` (503 until
  ready, then 200), ``/server_info`` (every ServerArgs field, ``version``,
  ``internal_states``) and ``/get_server_info`` (same, logs the deprecation
  warning), ``/model_info`` (the router asks for it when a worker is added),
  with uvicorn-style access log lines.
* Serving like 0.5.9: ``POST /generate`` (``{"text", "sampling_params":
  {"max_new_tokens": N}, "stream"}``) takes N x FLEETPATCH_STANDIN_TOKEN_SECONDS
  and answers ``{"text", "output_ids", "meta_info"}``, or with ``"stream":
  true`` server-sent events ``data: {...}`` (one per token, cumulative text,
  chunked transfer encoding) ending ``data: [DONE]``. At most
  ``--max-running-requests`` (default 48) run; the rest wait. ``GET /v1/loads``
  (``aggregate.total_running_reqs`` / ``total_waiting_reqs``) and the
  deprecated ``GET /get_load`` (logs its deprecation warning) count them.
  One scheduler loop (standin_steps.py, installed beside this file as
  ``sglang_standin_steps.py``): at each step the constructed worker of every TP
  rank runs its REAL ``forward_batch_generation`` once, with an EXTEND batch of
  the requests that arrived since the last step, then a DECODE batch holding
  every running request (one token each per step). Before its ready line the
  server sends itself 0.5.9's warmup request (``GET /model_info``, then
  ``POST /generate``), unless started with ``--skip-server-warmup``. Only the model-running steps it calls (draft, verify,
  forward_target_extend, the draft-extend helpers; _GPU_STEPS) are stubbed on
  the instance, so a line a patch logs in forward_batch_generation (or in a
  helper of its own) really executes. An exception there is logged as
  "Scheduler hit an exception: Traceback ..." and the server exits 1, the
  request's connection dropped, as when a real scheduler dies.
* SIGTERM after ready is 0.5.9's graceful exit: the server keeps serving
  (new /generate requests included) while ``/health`` answers 503; every
  FLEETPATCH_STANDIN_SIGTERM_POLL seconds (SGLang's watchdog: 5) it logs
  "Gracefully exiting... Remaining number of requests N ..." and exits 0 once
  N is 0. (Real SGLang then SIGKILLs its own process tree; the stand-in exits
  0.) SIGINT, and SIGTERM before ready, stop it at once with exit code 0.

* Multi-node (``--nnodes N --node-rank R --dist-init-addr HOST:PORT``, the real
  flags): each node builds only its own TP ranks (engine.py's rank ranges: with
  ``--tp-size 2 --nnodes 2`` node 0 runs TP0 and node 1 TP1), from ITS host's
  tree, under its ranks' prefixes. Before its first rank's worker, each node
  logs the release's "Init torch distributed begin." (0.5.21+: "Init parallel
  begin.") and meets the others in a real TCP rendezvous, as
  torch.distributed's TCPStore does: node 0 listens on PORT (all interfaces),
  the others connect to HOST:PORT, retrying until the deadline, and say their
  ranks; nobody goes on until all ``tp_size * pp_size`` ranks have joined. A
  timeout is the scheduler's exception, as torch raises it (node 0:
  ``torch.distributed.DistStoreError: Timed out after S seconds waiting for
  clients. J/W clients joined.``; node R: ``torch.distributed.DistNetworkError:
  The client socket has timed out after Mms while trying to connect to (HOST,
  PORT).``), then the server exits 1. Node 0 serves HTTP as above; nodes R >= 1
  serve only SGLang's launch_dummy_health_check_server on ``--port`` (GET
  /health, /health_generate, /ping answer 200, everything else 404, no access
  log), log "Dummy health check server started in background thread at
  HOST:PORT" and wait. Each step node 0's workers run is sent to the other
  nodes, whose workers run it too (TP ranks step together); a node that has
  gone is left out, so node 0 keeps serving (upstream issue #3099). When node 0
  goes away a node R >= 1 dies as its scheduler would (the gloo connection
  closed), except after 0.5.21+'s graceful shutdown (ShutdownReq: exit 0);
  SIGTERM on a node R >= 1 exits at once before 0.5.21, and from 0.5.21 is
  logged and waits for node 0's shutdown, as in engine.py.

Faithful consequences worth knowing: like real SGLang, EAGLE launches that
give ``--speculative-eagle-topk`` without ``--speculative-num-steps`` fail with
a bare AssertionError in _handle_speculative_decoding; and
``--enable-multi-layer-eagle`` on the v1 path of 0.5.9 - 0.5.12 fails with
``NameError: name 'ModelRunner' is not defined`` (an upstream bug in
multi_layer_eagle_worker.py). Without a readable ``<model-path>/config.json``
the model is taken to be a Llama checkpoint.

The stand-in never reads patch markers and never prints a line a patch would
print: only code from the tree can produce those.

Test-control environment variables:

``FLEETPATCH_STANDIN_STARTUP_DELAY``
    seconds to sleep before the ready line (model load), default 0.2.
``FLEETPATCH_STANDIN_CRASH_AFTER_INIT=1``
    after the worker is constructed, log a scheduler failure (RuntimeError
    traceback) and exit 1 before ready.
``FLEETPATCH_STANDIN_NEVER_READY=1``
    never print the ready line; /health stays 503; keeps running.
``FLEETPATCH_STANDIN_ROTATE_LOG=<path>``
    after the server_args line and before the worker is constructed, rotate the
    log like logrotate: rename <path> to <path>.1, open a new <path> for append
    and dup2 it onto fds 1 and 2.
``FLEETPATCH_STANDIN_EXIT_AFTER_READY=<seconds>``
    exit 1 with a traceback that many seconds after the ready line.
``FLEETPATCH_STANDIN_TOKEN_SECONDS``
    seconds per generated token, default 0.01.
``SGLANG_RUST_SERVER=1``
    as in SGLANG 0.5.22+: no uvicorn lines, and the ready line is the Rust
    server's (same text, tracing's format, on stdout). Earlier releases log
    Python's ready line as without it.
``FLEETPATCH_STANDIN_SIGTERM_POLL``
    seconds between the SIGTERM watchdog's checks, default 0.5 (SGLang: 5).
``FLEETPATCH_STANDIN_DIST_TIMEOUT``
    seconds the multi-node rendezvous waits (every node), default
    ``--dist-timeout`` or else 600 (torch's NCCL process-group default).
``FLEETPATCH_STANDIN_FAIL_RANK=<R>`` (with ``FLEETPATCH_STANDIN_FAIL_AFTER_S``)
    node R's scheduler dies that many seconds (default 0) after its node is up
    (node 0: ready; others: dummy health server up): "Scheduler hit an
    exception: Traceback ...", then exit 1. The other nodes carry on.
``FLEETPATCH_STANDIN_SPAWN_SCHEDULER=1``
    like SGLang, build each rank's draft worker in a scheduler process started
    with multiprocessing spawn (a fresh interpreter: site runs again there), not
    in the server's own process; the scheduler stays until the server exits.
    The server itself then constructs no worker (its /generate runs none).

Stdlib only; Python 3.8+.
"""

import argparse
import dataclasses
import errno
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import logging
import multiprocessing.connection   # now, before the stub finder: subprocess probes for Windows modules
import os
import random
import signal
import socket
import sys
import threading
import time
import traceback
import types

from fleetpatch_standin_common.httpserver import UvicornHandler, make_http_server
from fleetpatch_standin_common.output import env_float as _env_float, env_true as _env_true
from fleetpatch_standin_common.output import flush_streams as _flush, line_buffer_streams, rotate_log
from fleetpatch_standin_common.serving import Stop as _Stop, serve_until_stopped, stop_on_signals
from fleetpatch_standin_common.stubs import MISSING as _MISSING, Stub as _Stub, StubBase as _StubBase
from fleetpatch_standin_common.stubs import StubRules, is_dunder as _is_dunder
from fleetpatch_standin_common.stubs import install_stubs as _install_stub_rules

try:
    import sglang_standin_steps as _steps   # on a host: installed beside the stand-in
except ImportError:
    from fleetpatch_demo import standin_steps as _steps

logger = logging.getLogger("sglang.srt.entrypoints.engine")

# ---------------------------------------------------------------------------
# Permissive stubs
# ---------------------------------------------------------------------------

# Top-level packages that are always stubbed, even when installed: the
# stand-in has no GPU, and it must behave the same on every host.
FORCE_STUB = (
    "torch", "triton", "sgl_kernel", "flashinfer", "numpy", "transformers",
    "deep_gemm", "deep_ep", "vllm", "aiter", "tilelang", "cuda", "pynvml",
    "safetensors", "huggingface_hub", "tokenizers", "xgrammar", "outlines",
    "llguidance", "zmq", "uvloop", "uvicorn", "fastapi", "orjson", "psutil",
    "setproctitle", "requests", "aiohttp", "PIL", "einops", "mooncake",
    "nixl", "modelscope", "msgspec", "pybase64", "sentencepiece",
    "compressed_tensors", "quack", "cutlass", "apache_tvm_ffi", "tvm_ffi",
    "flash_attn", "sgl_fa", "mamba_ssm", "hip", "intel_extension_for_pytorch",
    "torch_npu", "torchvision", "torchaudio", "kernels", "openai", "pydantic",
    "partial_json_parser", "blobfile", "tiktoken", "interegular", "anthropic",
    "litellm", "prometheus_client", "opentelemetry", "nvtx", "pycuda", "cupy",
    "scipy", "soundfile", "decord", "av", "cv2", "timm", "datasets",
    "setuptools_scm", "gguf", "bitsandbytes", "ray",
)

# Modules inside these packages are never stubbed: the tree holds them
# completely, so a missing module there is a genuine ImportError.
NEVER_STUB = ("sglang.srt.speculative",)

# The tree holds all of sglang/srt/arg_groups/, but of it the stand-in runs only
# the declarations of the flags (the Structs/fields, their CLI registration, the
# argparse actions and choice lists): the resolution hooks and overrides probe
# hardware and model files, so the stand-in replays the routing part of them
# itself (apply_routing) and serves the other arg_groups modules as stubs.
STANDIN_RESOLVES = "sglang.srt.arg_groups"
REAL_ARG_GROUPS = ("", ".arg_utils", ".argparse_actions", ".choices", ".field_order", ".fields")


def _standin_resolves(fullname):
    if not fullname.startswith(STANDIN_RESOLVES + "."):
        return False
    rest = fullname[len(STANDIN_RESOLVES):]
    return rest not in REAL_ARG_GROUPS and not rest.startswith(".fields.")



# Calls of `is_*` helpers return False (not NPU, not HIP, not CPU, ...) except
# these, so the CUDA code path is taken.
TRUE_PREDICATES = {
    "is_cuda", "is_cuda_alike", "is_available", "is_flashinfer_available",
    "is_sm90_supported", "is_hopper_with_cuda_12_3",
    "is_triton_kernels_available", "is_fa3_default_architecture",
    "is_initialized",
}

def install_stubs():
    _install_stub_rules(STUB_RULES)


# ---------------------------------------------------------------------------
# Concrete replacements for the few names whose value matters
# ---------------------------------------------------------------------------

# --- sglang.srt.environ (the real file is not in the tree) -----------------
# Types and defaults of the variables server_args.py and speculative/ read
# (from SGLang's environ.py); other names are parsed leniently.
_ENV_TABLE = {
    "SGLANG_ENABLE_SPEC_V2": ("bool", False),
    "SGLANG_ENABLE_OVERLAP_PLAN_STREAM": ("bool", False),
    "SGLANG_SPEC_ENABLE_STRICT_FILTER_CHECK": ("bool", True),
    "SGLANG_SIMULATE_ACC_LEN": ("float", -1.0),
    "SGLANG_SIMULATE_ACC_METHOD": ("str", "match-expected"),
    "SGLANG_SIMULATE_ACC_TOKEN_MODE": ("str", "fixed"),
    "SGLANG_NGRAM_FORCE_GREEDY_VERIFY": ("bool", False),
    "SGLANG_NVFP4_CKPT_FP8_NEXTN_MOE": ("bool", False),
    "SGLANG_SPEC_NAN_DETECTION": ("bool", False),
    "SGLANG_SPEC_OOB_DETECTION": ("bool", False),
    "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": ("bool", False),
    "SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE": ("bool", False),
    "SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES": ("int", None),
    "SGLANG_PREFILL_DELAYER_TOKEN_USAGE_LOW_WATERMARK": ("float", None),
    "SGLANG_SYMM_MEM_PREALLOC_GB_SIZE": ("int", -1),
    "SGLANG_EMBEDDINGS_SPARSE_HEAD": ("str", None),
    "SGLANG_MAMBA_SSM_DTYPE": ("str", None),
    "SGLANG_TOOL_STRICT_LEVEL": ("int", 0),
    "SGLANG_USE_MODELSCOPE": ("bool", False),
    "SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": ("int", 2048),
    "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": ("int", 2048),
    "SGLANG_RETURN_ORIGINAL_LOGPROB": ("bool", False),
    "SGLANG_DISAGG_STAGING_BUFFER": ("bool", False),
    "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": ("bool", False),
    "SGLANG_ENABLE_TORCH_COMPILE": ("bool", False),
    "SGLANG_DISABLE_OUTLINES_DISK_CACHE": ("bool", False),
    "SGLANG_MOE_NVFP4_DISPATCH": ("bool", False),
    "SGLANG_NSA_FORCE_MLA": ("bool", False),
    "SGLANG_LOG_MS": ("bool", False),
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": ("bool", True),
    "SGLANG_ENABLE_GRPC": ("bool", False),
    "SGLANG_GRPC_PORT": ("int", None),
    "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": ("bool", False),
    "SGLANG_ENABLE_UNIFIED_RADIX_TREE": ("bool", False),
    "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK": ("int", 4096),
    "SGLANG_NPU_FUSED_MOE_MODE": ("int", 1),
    "SGLANG_VLM_CACHE_SIZE_MB": ("int", 100),
    "SGLANG_USE_AITER": ("bool", False),
    "SGLANG_CUTLASS_MOE": ("bool", False),
    "SGLANG_HACK_FLASHMLA_BACKEND": ("str", "tilelang"),
    "SGLANG_AITER_KV_CACHE_LAYOUT": ("str", "nhd"),
}


def _parse_env_bool(value):
    # sglang.srt.environ.EnvBool.parse
    value = value.lower()
    if value in ["true", "1", "yes", "y"]:
        return True
    if value in ["false", "0", "no", "n"]:
        return False
    raise ValueError('"%s" is not a valid boolean value' % value)


def _parse_env_lenient(value):
    low = value.strip().lower()
    if low in ("true", "yes", "y"):
        return True
    if low in ("false", "no", "n"):
        return False
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


class EnvField(object):
    """Mirror of sglang.srt.environ.EnvField (get/set/is_set/override/clear)."""

    def __init__(self, name, kind, default):
        self.name, self.kind, self.default = name, kind, default
        self._set_to_none = False

    def parse(self, value):
        if self.kind == "bool":
            return _parse_env_bool(value)
        if self.kind == "int":
            try:
                return int(value)
            except ValueError:
                raise ValueError('"%s" is not a valid integer value' % value)
        if self.kind == "float":
            try:
                return float(value)
            except ValueError:
                raise ValueError('"%s" is not a valid float value' % value)
        if self.kind == "str":
            return value
        return _parse_env_lenient(value)

    def get(self):
        value = os.getenv(self.name)
        if self._set_to_none:
            return None
        if value is None:
            return self.default
        try:
            return self.parse(value)
        except ValueError as e:
            import warnings
            warnings.warn('Invalid value for %s: %s, using default "%s"' % (self.name, e, self.default))
            return self.default

    def is_set(self):
        return self.name in os.environ

    def set(self, value):
        self._set_to_none = value is None
        os.environ[self.name] = str(value)

    def clear(self):
        os.environ.pop(self.name, None)
        self._set_to_none = False

    def override(self, value):
        import contextlib

        @contextlib.contextmanager
        def _cm():
            present, old, old_none = self.name in os.environ, os.environ.get(self.name), self._set_to_none
            self.set(value)
            try:
                yield
            finally:
                if present:
                    os.environ[self.name] = old
                else:
                    os.environ.pop(self.name, None)
                self._set_to_none = old_none
        return _cm()

    def __bool__(self):
        raise RuntimeError("Please use `envs.YOUR_FLAG.get()` instead of `envs.YOUR_FLAG`")


class _Envs(object):
    def __getattr__(self, name):
        if _is_dunder(name):
            raise AttributeError(name)
        kind, default = _ENV_TABLE.get(name, ("any", False))
        field = EnvField(name, kind, default)
        object.__setattr__(self, name, field)
        return field


# --- sglang.srt.utils(.common) helpers --------------------------------------
_warned_bool_env_var_keys = set()


def get_bool_env_var(name, default="false"):
    value = os.getenv(name, default).lower()
    if value not in ("true", "1", "false", "0"):
        if name not in _warned_bool_env_var_keys:
            logging.getLogger("sglang.srt.utils.common").warning(
                "get_bool_env_var(%s) see non-understandable value=%s and treat as false" % (name, value))
            _warned_bool_env_var_keys.add(name)
    return value in ("true", "1")


def get_int_env_var(name, default=0):
    value = os.getenv(name)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        return default


def get_float_env_var(name, default=0.0):
    value = os.getenv(name)
    if value is None or not value.strip():
        return default
    try:
        return float(value)
    except ValueError:
        return default


def nullable_str(val):
    if not val or val == "None":
        return None
    return val


def json_list_type(value):
    try:
        return json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError("Invalid JSON list: %s. Please provide a valid JSON list." % value)


def parse_connector_type(url):
    import re
    m = re.match(r"(.+)://(.*)", url)
    return "" if m is None else m.group(1)


def is_no_spec_infer_or_topk_one(server_args):
    return server_args.speculative_eagle_topk is None or (
        server_args.speculative_eagle_topk == 1
        and (server_args.page_size == 1 or server_args.page_size is None))


def human_readable_int(value):
    """SI (k, M, G, T) and IEC (Ki, Mi, Gi, Ti) suffixes, as in SGLang."""
    import re
    from decimal import Decimal
    value = value.strip()
    si = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}
    iec = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    "Decimals are not allowed with IEC suffixes like '%s'." % suffix)
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Invalid integer value: '%s'. Use a plain integer, SI suffixes (1k, 1M), or IEC "
            "suffixes (1Ki, 1Mi). Suffixes are case-sensitive." % value)


def next_power_of_2(n):
    return 1 << (n - 1).bit_length() if n > 0 else 1


def round_up(x, y):
    return ((x - 1) // y + 1) * y


def ceil_div(a, b):
    return (a + b - 1) // b


class EmptyContextManager(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def empty_context(*args, **kwargs):
    return EmptyContextManager()


_GPU_MEM = {"avail": 78.52}


def get_available_gpu_memory(*args, **kwargs):
    """Simulated free memory of an 80 GB GPU, shrinking a little per call."""
    _GPU_MEM["avail"] = max(1.0, round(_GPU_MEM["avail"] - random.uniform(0.01, 0.4), 2))
    return _GPU_MEM["avail"]


def get_device_memory_capacity(*args, **kwargs):
    return 81559.0


class _DeviceName(str):
    """"cuda", also as 0.5.19+'s runtime_context.get_device() config (its .device)."""

    @property
    def device(self):
        return str(self)


def get_device(*args, **kwargs):
    return _DeviceName("cuda")


def get_device_name(*args, **kwargs):
    return "NVIDIA H100 80GB HBM3"


def get_device_sm(*args, **kwargs):
    return 90


def get_device_capability(*args, **kwargs):
    return (9, 0)


def get_free_port(*args, **kwargs):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_release(*args, **kwargs):
    return (2, 9)


def get_exception_traceback():
    return "".join(traceback.format_exception(*sys.exc_info()))


def get_world_size(*args, **kwargs):
    return _RANK["tp_size"]


def get_rank(*args, **kwargs):
    return _RANK["tp_rank"]


_RANK = {"tp_rank": 0, "tp_size": 1}


class _Group(_StubBase):
    """Simulated process group (tp_group, attention tp group, ...)."""

    def __init__(self, name="tp"):
        self.group_name = name

    @property
    def world_size(self):
        return _RANK["tp_size"]

    @property
    def rank_in_group(self):
        return _RANK["tp_rank"]

    @property
    def rank(self):
        return _RANK["tp_rank"]

    @property
    def ranks(self):
        return list(range(_RANK["tp_size"]))

    @property
    def first_rank(self):
        return 0

    @property
    def is_first_rank(self):
        return _RANK["tp_rank"] == 0

    @property
    def last_rank(self):
        return _RANK["tp_size"] - 1

    @property
    def is_last_rank(self):
        return _RANK["tp_rank"] == _RANK["tp_size"] - 1


def _group_getter(name):
    def getter(*args, **kwargs):
        return _Group(name)
    getter.__name__ = "get_%s_group" % name
    return getter


def get_batch_sizes_to_capture(model_runner, *args, **kwargs):
    """(capture_bs, compile_bs) like sglang.srt.model_executor.cuda_graph_runner."""
    sa = model_runner.server_args
    capture_bs = list(getattr(sa, "cuda_graph_bs", None) or [1, 2, 4, 8, 12, 16, 24, 32, 40, 48])
    max_bs = getattr(sa, "cuda_graph_max_bs", None)
    if isinstance(max_bs, int):
        capture_bs = [bs for bs in capture_bs if bs <= max_bs] or [1]
    capture_bs = sorted(set(capture_bs))
    compile_bs = ([bs for bs in capture_bs if bs <= sa.torch_compile_max_bs]
                  if getattr(sa, "enable_torch_compile", False) else [])
    return capture_bs, compile_bs


# Methods whose result is unpacked into a tuple.
def _pair(*args, **kwargs):
    return (_Stub("first"), _Stub("second"))


def get_model_architecture(model_config, *args, **kwargs):
    """sglang.srt.model_loader.utils: (model class, architecture name). The class is
    a plain one, so that getattr(cls, "draft_parallel_spec", None) (0.5.23) sees
    no declaration, as for a model that makes none."""
    hf_config = getattr(model_config, "hf_config", None)
    archs = getattr(hf_config, "architectures", None) or ["LlamaForCausalLM"]
    return type(str(archs[0]), (object,), {}), archs[0]


# Names that have the same meaning wherever a stub module (or stub object)
# provides them.
_BY_NAME = {
    "get_bool_env_var": get_bool_env_var,
    "get_int_env_var": get_int_env_var,
    "get_float_env_var": get_float_env_var,
    "nullable_str": nullable_str,
    "json_list_type": json_list_type,
    "parse_connector_type": parse_connector_type,
    "next_power_of_2": next_power_of_2,
    "human_readable_int": human_readable_int,
    "is_no_spec_infer_or_topk_one": is_no_spec_infer_or_topk_one,
    "round_up": round_up,
    "ceil_div": ceil_div,
    "cdiv": ceil_div,
    "empty_context": empty_context,
    "EmptyContextManager": EmptyContextManager,
    "get_available_gpu_memory": get_available_gpu_memory,
    "get_device_memory_capacity": get_device_memory_capacity,
    "get_device": get_device,
    "get_device_name": get_device_name,
    "get_device_sm": get_device_sm,
    "get_device_capability": get_device_capability,
    "get_free_port": get_free_port,
    "torch_release": torch_release,
    "get_exception_traceback": get_exception_traceback,
    "get_tp_group": _group_getter("tp"),
    "get_attention_tp_group": _group_getter("attention_tp"),
    "get_attn_tp_group": _group_getter("attention_tp"),
    "get_moe_ep_group": _group_getter("moe_ep"),
    "get_moe_tp_group": _group_getter("moe_tp"),
    "get_pp_group": _group_getter("pp"),
    "get_world_group": _group_getter("world"),
    "get_tensor_model_parallel_world_size": get_world_size,
    "get_tensor_model_parallel_rank": get_rank,
    "get_attention_tp_size": get_world_size,
    "get_attention_tp_rank": get_rank,
    "get_embed_and_head": _pair,
    "get_batch_sizes_to_capture": get_batch_sizes_to_capture,
    "get_model_architecture": get_model_architecture,
    "get_memory_pool": _pair,
    "is_out_of_tree": lambda *a, **k: False,
    "LORA_TARGET_ALL_MODULES": "all",
    "SUPPORTED_LORA_TARGET_MODULES": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
        "qkv_proj", "gate_up_proj", "embed_tokens", "lm_head"],
}


@dataclasses.dataclass(frozen=True)
class ParallelState(object):
    """sglang.srt.distributed.parallel_state_wrapper.ParallelState (0.5.16 - 0.5.21):
    the worker copies it with dataclasses.replace, so it must be a real dataclass."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    dp_rank: object = 0
    dp_size: int = 1
    attn_tp_rank: int = 0
    attn_tp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    attn_dp_rank: int = 0
    attn_dp_size: int = 1
    moe_ep_rank: int = 0
    moe_ep_size: int = 1
    moe_dp_rank: object = 0
    moe_dp_size: int = 1
    dcp_size: int = 1
    gpu_id: int = 0

    @staticmethod
    def trivial(**overrides):
        return ParallelState(**overrides)


def resolving_view(server_args):
    # sglang.srt.arg_groups.overrides (0.5.19+): the resolved view of ServerArgs;
    # the stand-in's ServerArgs is already resolved.
    return server_args


class _ConfigView(object):
    """What 0.5.19+'s sglang.srt.runtime_context getters (get_spec, get_model, ...)
    return: the launch's settings, read here from the ServerArgs being served."""

    def __getattr__(self, attr):
        if _is_dunder(attr):
            raise AttributeError(attr)
        value = getattr(_State.server_args, attr, _MISSING)
        return _Stub("runtime_context." + attr) if value is _MISSING else value


def _runtime_config(*args, **kwargs):
    return _ConfigView()


_BY_NAME.update(ParallelState=ParallelState, resolving_view=resolving_view,
                **{name: _runtime_config for name in ("get_spec", "get_context", "get_exec", "get_model",
                                                      "get_parallel", "get_schedule")})


# --- simulated model config / target worker ---------------------------------

def _read_hf_config(path):
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f)
    except Exception:
        return {}


class _HfConfig(object):
    """A Hugging Face config: real attributes only (getattr(cfg, x, default)
    must see the default, as with transformers.PretrainedConfig)."""

    _LLAMA = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
        "vocab_size": 128256, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "hidden_act": "silu",
    }

    def __init__(self, values):
        if not isinstance(values.get("architectures"), list) or not values.get("architectures"):
            # No readable config.json (a stand-in host has no model weights):
            # behave like a Llama checkpoint.
            values = dict(self._LLAMA, **{k: v for k, v in values.items() if k != "architectures"})
        for key, value in self._LLAMA.items():
            values.setdefault(key, value)
        self.__dict__.update(values)

    def get(self, key, default=None):
        return self.__dict__.get(key, default)

    def to_dict(self):
        return dict(self.__dict__)


class ModelConfig(_StubBase):
    """Simulated sglang.srt.configs.model_config.ModelConfig."""

    def __init__(self, model_path="", context_length=None, is_draft_model=False, **kwargs):
        self.model_path = model_path
        self.is_draft_model = is_draft_model
        self.hf_config = _HfConfig(_read_hf_config(model_path) if isinstance(model_path, str) else {})
        self.hf_text_config = self.hf_config
        self.context_len = int(context_length or self.hf_config.max_position_embeddings or 131072)
        self.num_hidden_layers = self.hf_config.num_hidden_layers
        self.num_attention_layers = self.num_hidden_layers
        self.hidden_size = self.hf_config.hidden_size
        self.vocab_size = self.hf_config.vocab_size
        self.num_attention_heads = self.hf_config.num_attention_heads
        self.num_key_value_heads = self.hf_config.num_key_value_heads
        self.head_dim = self.hidden_size // max(1, self.num_attention_heads)
        self.is_multimodal = False
        self.is_generation = True
        self.is_hybrid_swa = False
        self.sliding_window_size = None

    @classmethod
    def from_server_args(cls, server_args, model_path=None, is_draft_model=False, **kwargs):
        path = model_path or getattr(server_args, "model_path", "")
        if is_draft_model and getattr(server_args, "speculative_draft_model_path", None):
            path = server_args.speculative_draft_model_path
        return cls(path, context_length=getattr(server_args, "context_length", None),
                   is_draft_model=is_draft_model)

    def get_num_kv_heads(self, tp_size=1):
        return max(1, self.num_key_value_heads // max(1, tp_size))


class _Model(_StubBase):
    def __init__(self, draft=False):
        self.hot_token_id = None
        self.load_lm_head_from_target = False

    def get_embed_and_head(self):
        return (_Stub("embed_tokens.weight"), _Stub("lm_head.weight"))

    def get_embed(self):
        return _Stub("embed_tokens.weight")

    def set_embed_and_head(self, embed, head):
        pass

    def set_embed(self, embed):
        pass


class _ModelRunner(_StubBase):
    """Simulated sglang.srt.model_executor.model_runner.ModelRunner."""

    def __init__(self, server_args, gpu_id, tp_rank, is_draft_worker, model_config,
                 req_to_token_pool=None, token_to_kv_pool_allocator=None):
        self.server_args = server_args
        self.model_config = model_config
        self.device = server_args.device or "cuda"
        self.gpu_id = gpu_id
        self.tp_rank = tp_rank
        self.tp_size = server_args.tp_size
        self.pp_rank = 0
        self.pp_size = server_args.pp_size
        self.dp_size = server_args.dp_size
        self.is_draft_worker = is_draft_worker
        self.page_size = server_args.page_size
        self.model = _Model(draft=is_draft_worker)
        self.tp_group = _Group("tp")
        self.attention_tp_group = _Group("attention_tp")
        self.req_to_token_pool = req_to_token_pool or _Stub("req_to_token_pool")
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator or _Stub("token_to_kv_pool_allocator")
        self.token_to_kv_pool = _Stub("token_to_kv_pool")
        self.max_total_num_tokens = 400000
        self.max_running_requests = server_args.max_running_requests or 48
        self.sliding_window_size = None
        self.is_hybrid_swa = False
        self.is_hybrid_gdn = False
        self.use_mla_backend = False
        self.spec_algorithm = _Stub("spec_algorithm")
        self.attn_backend = _Stub("attn_backend")
        self.graph_runner = None
        self.cuda_graph_runner = None
        self.dtype = _Stub("torch.bfloat16")


class _Tokenizer(object):
    """One simulated tokenizer shared by target and draft (same vocabulary)."""

    vocab_size = 128256
    eos_token_id = 128001
    pad_token_id = None

    def get_vocab(self):
        return {}

    def __len__(self):
        return self.vocab_size


_TOKENIZER = _Tokenizer()


class TpModelWorker(_StubBase):
    """Simulated sglang.srt.managers.tp_worker.TpModelWorker (target and draft
    base). Keeps the attributes the real one sets; logs its model loading."""

    def __init__(self, server_args=None, gpu_id=0, tp_rank=0, moe_ep_rank=0, pp_rank=0,
                 dp_rank=None, nccl_port=0, is_draft_worker=False, req_to_token_pool=None,
                 token_to_kv_pool_allocator=None, attn_cp_rank=0, moe_dp_rank=0, **kwargs):
        self.server_args = server_args
        self.tp_size = server_args.tp_size
        self.ep_size = server_args.ep_size
        self.pp_size = server_args.pp_size
        self.tp_rank, self.moe_ep_rank, self.pp_rank, self.dp_rank = tp_rank, moe_ep_rank, pp_rank, dp_rank
        self.attn_cp_rank, self.moe_dp_rank = attn_cp_rank, moe_dp_rank
        self.gpu_id, self.nccl_port = gpu_id, nccl_port
        self.is_draft_worker = is_draft_worker
        self.is_multi_layer_eagle = kwargs.get("is_multi_layer_eagle", False)
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.model_config = ModelConfig.from_server_args(server_args, is_draft_model=is_draft_worker)
        self.tokenizer = self.processor = _TOKENIZER
        log = logging.getLogger("sglang.srt.model_executor.model_runner")
        before = get_available_gpu_memory()
        log.info("Load weight begin. avail mem=%.2f GB" % before)
        self._model_runner = _ModelRunner(server_args, gpu_id, tp_rank, is_draft_worker,
                                          self.model_config, req_to_token_pool,
                                          token_to_kv_pool_allocator)
        after = get_available_gpu_memory()
        log.info("Load weight end. type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB."
                 % (self.model_config.hf_config.architectures[0], after, before - after))
        if not is_draft_worker:
            log.info("KV Cache is allocated. #tokens: %d, K size: 12.21 GB, V size: 12.21 GB"
                     % self._model_runner.max_total_num_tokens)
        self.device = self._model_runner.device
        self.max_total_num_tokens = self._model_runner.max_total_num_tokens
        self.max_prefill_tokens = server_args.max_prefill_tokens
        self.max_running_requests = self._model_runner.max_running_requests
        self.max_req_len = min(self.model_config.context_len - 1, self.max_total_num_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        self.random_seed = server_args.random_seed
        self.enable_overlap = not server_args.disable_overlap_schedule
        self.enable_spec = server_args.speculative_algorithm is not None
        self.hicache_layer_transfer_counter = None

    @property
    def model_runner(self):
        return self._model_runner

    def get_memory_pool(self):
        return (self._model_runner.req_to_token_pool, self._model_runner.token_to_kv_pool_allocator)

    def get_worker_info(self):
        return (self.max_total_num_tokens, self.max_prefill_tokens, self.max_running_requests,
                self.max_req_len, self.max_req_input_len, self.random_seed, self.device, None, None, None)


# --- sglang.srt.arg_groups (0.5.15+; not part of the host tree) --------------
# server_args.py of 0.5.15+ declares its flags as `A[type, Arg(...)]` field
# annotations and registers them with add_cli_args_from_dataclass; these are
# faithful copies of SGLang's arg_utils.py / argparse_actions.py logic so that
# the tree's real ServerArgs builds the real parser.

def _arg_utils_attrs():
    import typing
    Annotated = getattr(typing, "Annotated", None)
    if Annotated is None:  # Python < 3.9: SGLang 0.5.15 needs >= 3.10 anyway
        return {}
    get_origin, get_args = typing.get_origin, typing.get_args

    @dataclasses.dataclass(frozen=True)
    class Arg(object):
        help: str = ""
        choices: object = None
        aliases: object = None
        cli_name: object = None
        type_parser: object = None
        nargs: object = None
        required: object = None
        action: object = None
        action_kwargs: object = None
        const: object = None
        no_cli: bool = False
        resolvable: bool = False

    def _unwrap_annotated(tp):
        if get_origin(tp) is Annotated:
            args = get_args(tp)
            for a in args[1:]:
                if isinstance(a, Arg):
                    return args[0], a
                if isinstance(a, str):
                    return args[0], Arg(help=a)
            return args[0], None
        return tp, None

    def _unwrap_optional(tp):
        origin = get_origin(tp)
        if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
            non_none = [a for a in get_args(tp) if a is not type(None)]
            if len(non_none) == 1:
                return non_none[0], True
        return tp, False

    def _infer_type_func(tp):
        return tp if tp in (str, int, float) else str

    def _field_default(field):
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return dataclasses.MISSING

    def resolvable_fields(cls):
        if not dataclasses.is_dataclass(cls):
            return frozenset()
        hints = typing.get_type_hints(cls, include_extras=True)
        return frozenset(f.name for f in dataclasses.fields(cls)
                         if (_unwrap_annotated(hints.get(f.name, f.type))[1] or Arg()).resolvable)

    def add_cli_args_from_dataclass(parser, cls, fields=None):
        hints = typing.get_type_hints(cls, include_extras=True)
        for field in dataclasses.fields(cls):
            if fields is not None and field.name not in fields:
                continue
            hint = hints.get(field.name)
            if hint is None:
                continue
            raw_type, meta = _unwrap_annotated(hint)
            if meta is None or meta.no_cli:
                continue
            cli_name = meta.cli_name or "--" + field.name.replace("_", "-")
            names = [cli_name] + list(meta.aliases or [])
            default = _field_default(field)
            auto_dest = cli_name.lstrip("-").replace("-", "_")
            kwargs = {"dest": field.name} if field.name != auto_dest else {}
            kwargs["help"] = meta.help
            if default is not dataclasses.MISSING:
                kwargs["default"] = default
            if meta.action is not None:
                kwargs["action"] = meta.action
                kwargs.update(meta.action_kwargs or {})
                parser.add_argument(*names, **kwargs)
                continue
            inner, _ = _unwrap_optional(raw_type)
            if meta.const is not None:
                kwargs["const"] = meta.const
            if get_origin(inner) is typing.Literal:
                vals = list(get_args(inner))
                kwargs["type"] = meta.type_parser or _infer_type_func(type(vals[0]) if vals else str)
                kwargs["choices"] = meta.choices or vals
            elif get_origin(inner) in (list, typing.List) and meta.type_parser is None:
                elem = get_args(inner)
                kwargs["type"] = _infer_type_func(elem[0] if elem else str)
                kwargs["nargs"] = meta.nargs or "+"
                if meta.choices:
                    kwargs["choices"] = meta.choices
            elif inner is bool:
                kwargs["action"] = "store_true"
                kwargs.pop("const", None)
            else:
                kwargs["type"] = meta.type_parser or _infer_type_func(inner)
                if meta.choices:
                    kwargs["choices"] = meta.choices
                if meta.nargs:
                    kwargs["nargs"] = meta.nargs
                if (meta.required is True or (meta.required is None and default is dataclasses.MISSING)) \
                        and any(n.startswith("-") for n in names):
                    kwargs["required"] = True
            parser.add_argument(*names, **kwargs)

    return {"A": Annotated, "Arg": Arg, "add_cli_args_from_dataclass": add_cli_args_from_dataclass,
            "resolvable_fields": resolvable_fields}


def print_deprecated_warning(message):
    logging.getLogger("sglang.srt.arg_groups.argparse_actions").warning("\033[1;33m%s\033[0m" % message)


class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        paths = []
        for path in values or []:
            path = path.strip()
            paths.append(json.loads(path) if path.startswith("{") and path.endswith("}") else path)
        setattr(namespace, self.dest, paths)


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, error_message=None, **kwargs):
        # 0.5.19+: a deprecated flag may carry its own message.
        self.error_message = error_message
        super(DeprecatedAction, self).__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print_deprecated_warning("The command line argument '%s' is deprecated and will be removed in future versions." % option_string)


class _DeprecatedWithReplacement(argparse.Action):
    def _warn(self, option_string):
        replacement = " Use '%s' instead." % self.new_flag if self.new_flag else ""
        print_deprecated_warning("'%s' is deprecated and will be removed in a future release.%s" % (option_string, replacement))


class DeprecatedStoreTrueAction(_DeprecatedWithReplacement):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        self.new_flag = new_flag
        super(DeprecatedStoreTrueAction, self).__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        self._warn(option_string)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(_DeprecatedWithReplacement):
    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kwargs):
        self.new_flag, self.const_value = new_flag, const_value
        super(DeprecatedStoreConstAction, self).__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        self._warn(option_string)
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAliasStoreAction(_DeprecatedWithReplacement):
    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super(DeprecatedAliasStoreAction, self).__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        self._warn(option_string)
        setattr(namespace, self.dest, values)


# --- msgspec (0.5.20+: ServerArgs is a msgspec Struct) ------------------------
# From 0.5.20 the launch flags are fields of msgspec Structs declared in
# sglang/srt/arg_groups/fields/*.py, and server_args.py assembles ServerArgs with
# msgspec.defstruct. What of msgspec the releases use on that path (read from the
# 0.5.20 - 0.5.23 wheels): Struct (class keywords frozen=, dict=), field,
# NODEFAULT, defstruct, structs.fields / asdict / replace, Struct.__setattr__.
# msgspec is not installed on a stand-in host, so this is a stdlib rendition:
# fields live in the instance __dict__, which is what dict=True gives too.

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


_MSGSPEC_STRUCTS = {"fields": struct_fields, "asdict": struct_asdict, "astuple": struct_astuple,
                    "replace": struct_replace, "FieldInfo": FieldInfo}
_MSGSPEC = {"Struct": Struct, "field": msgspec_field, "NODEFAULT": NODEFAULT,
            "defstruct": defstruct}


def record_fields(record):
    """The field names of a ServerArgs: a dataclass through 0.5.19, a Struct after."""
    names = getattr(record, "__struct_fields__", None)
    if names is not None:
        return tuple(names)
    return tuple(f.name for f in dataclasses.fields(record))


_UTILS = {}  # filled below: same helpers in sglang.srt.utils and sglang.srt.utils.common

_MODULE_ATTRS = {
    "sglang.srt.environ": {"envs": _Envs(), "EnvField": EnvField},
    "sglang.srt.managers.tp_worker": {"TpModelWorker": TpModelWorker},
    "sglang.srt.configs.model_config": {"ModelConfig": ModelConfig},
    "sglang.srt.configs": {"ModelConfig": ModelConfig},
    "sglang.srt.arg_groups.arg_utils": _arg_utils_attrs(),
    "sglang.srt.arg_groups.argparse_actions": {
        "LoRAPathAction": LoRAPathAction, "DeprecatedAction": DeprecatedAction,
        "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
        "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
        "DeprecatedAliasStoreAction": DeprecatedAliasStoreAction,
        "print_deprecated_warning": print_deprecated_warning},
    "sglang.srt.utils": _UTILS,
    "sglang.srt.utils.common": _UTILS,
    "msgspec": _MSGSPEC,
    "msgspec.structs": _MSGSPEC_STRUCTS,
}

STUB_RULES = StubRules(force_stub=FORCE_STUB, never_stub=NEVER_STUB, true_predicates=TRUE_PREDICATES,
                       concrete=_BY_NAME, module_attrs=_MODULE_ATTRS, also_stub=_standin_resolves)


# ---------------------------------------------------------------------------
# Output helpers
# ---------------------------------------------------------------------------

def configure_logging(server_args, prefix=""):
    """Like sglang.srt.utils.common.configure_logger."""
    level = getattr(logging, str(getattr(server_args, "log_level", "info") or "info").upper(), logging.INFO)
    logging.basicConfig(level=level, format="[%(asctime)s" + prefix + "] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)


def _rank_prefix(server_args, tp_rank, dp_rank):
    # sglang.srt.managers.scheduler.run_scheduler_process
    prefix = ""
    if dp_rank is not None:
        prefix += " DP%d" % dp_rank
    if getattr(server_args, "pp_size", 1) > 1:
        prefix += " PP0"
    if getattr(server_args, "tp_size", 1) > 1:
        prefix += " TP%d" % tp_rank
    if getattr(server_args, "ep_size", 1) > 1:
        prefix += " EP%d" % (tp_rank % server_args.ep_size)
    return prefix


# ---------------------------------------------------------------------------
# Startup
# ---------------------------------------------------------------------------

def build_server_args(argv):
    """Parse the launch flags with the tree's real parser and build ServerArgs
    with the tree's from_cli_args, skipping __post_init__ (hardware probing)."""
    server_args_mod = importlib.import_module("sglang.srt.server_args")
    ServerArgs = server_args_mod.ServerArgs
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    _relax_stub_choices(parser)
    raw_args = parser.parse_args(argv)

    post_init = ServerArgs.__dict__.get("__post_init__")
    ServerArgs.__post_init__ = lambda self: None
    try:
        server_args = ServerArgs.from_cli_args(raw_args)
    finally:
        if post_init is not None:
            ServerArgs.__post_init__ = post_init
        else:  # pragma: no cover
            del ServerArgs.__post_init__
    return server_args_mod, server_args


def _relax_stub_choices(parser):
    # A few choice lists come from registries in modules the tree lacks (e.g.
    # ReasoningParser.DetectorMap): under stubs they are empty, which would
    # reject every value. Real SGLang has real lists there; accept any value.
    for action in parser._actions:
        choices = action.choices
        if choices is None or isinstance(choices, dict):
            continue
        try:
            values = list(choices)
        except TypeError:
            continue
        if not values or all(v in ("auto", "none", None) for v in values) and len(values) <= 1:
            action.choices = None


_POST_INIT_STEPS = (
    "_handle_deprecated_args",
    "_handle_prefill_delayer_env_compat",
    "_handle_missing_default_values",
    "_handle_gpu_memory_settings",
    "_handle_sampling_backend",
    "_handle_attention_backend_compatibility",
    "_handle_page_size",
    "_handle_pipeline_parallelism",
    "_handle_speculative_decoding",
)


# 0.5.15+: the speculative handling lives outside server_args.py.
_POST_INIT_STEPS_V2_ONLY = (
    "_handle_deprecated_args",
    "_handle_missing_default_values",
)


def apply_routing(server_args):
    """Run the tree's own speculative-decoding handling (see module docstring)."""
    cls = type(server_args)
    if getattr(server_args, "device", None) is None:
        server_args.device = "cuda"
    # The handlers of ServerArgs.__post_init__ that the routing depends on, in
    # their real order; the rest probe hardware and model files.
    has_spec_handler = getattr(cls, "_handle_speculative_decoding", None) is not None
    for name in (_POST_INIT_STEPS if has_spec_handler else _POST_INIT_STEPS_V2_ONLY):
        method = getattr(cls, name, None)
        if method is None:
            continue
        if name == "_handle_gpu_memory_settings":
            method(server_args, get_device_memory_capacity(server_args.device))
        else:
            method(server_args)
    if not has_spec_handler:
        _handle_speculative_decoding_v2_only(server_args)


def _version_tuple():
    parts = []
    for piece in _sglang_version().split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _handle_speculative_decoding_v2_only(server_args):
    """SGLang 0.5.13+ moved the speculative handling out of server_args.py into
    sglang/srt/arg_groups/speculative_hook.py, which is not part of the host
    tree; this replicates its EAGLE/STANDALONE/NGRAM part. Only V2 workers
    exist. 0.5.13: SGLANG_ENABLE_SPEC_V2 unset/false selects the non-overlap
    (synchronous) V2 path; 0.5.14+: the variable is retired (a notice is
    logged) and the overlap scheduler stays as the user chose."""
    log = logging.getLogger("sglang.srt.arg_groups.speculative_hook")
    env_v2_era = _version_tuple() < (0, 5, 14)
    if server_args.speculative_draft_model_path is not None and server_args.speculative_draft_model_revision is None:
        server_args.speculative_draft_model_revision = "main"
    if server_args.speculative_algorithm is None:
        return
    server_args.speculative_algorithm = server_args.speculative_algorithm.upper()
    if not env_v2_era and os.getenv("SGLANG_ENABLE_SPEC_V2") is not None:
        log.warning(
            "SGLANG_ENABLE_SPEC_V2 has been removed: speculative decoding "
            "always runs the V2 worker. Use --disable-overlap-schedule to "
            "select the non-overlap (synchronous) path.")
    if server_args.speculative_algorithm == "NEXTN":
        server_args.speculative_algorithm = "EAGLE"
    if server_args.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        if server_args.max_running_requests is None:
            server_args.max_running_requests = 48
            log.warning(
                "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests.")
        if env_v2_era and not _Envs().SGLANG_ENABLE_SPEC_V2.get() and not server_args.disable_overlap_schedule:
            server_args.disable_overlap_schedule = True
        if server_args.disable_overlap_schedule:
            log.warning("Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding.")
        elif env_v2_era:
            log.warning("Overlap spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.")
        if server_args.enable_mixed_chunk:
            server_args.enable_mixed_chunk = False
            log.warning("Mixed chunked prefill is disabled because of using eagle speculative decoding.")
        if server_args.speculative_num_steps is None:
            server_args.speculative_num_steps, server_args.speculative_eagle_topk, server_args.speculative_num_draft_tokens = (
                (3, 1, 4) if server_args.speculative_algorithm == "STANDALONE" else (5, 4, 8))
        if (server_args.speculative_eagle_topk == 1
                and server_args.speculative_num_draft_tokens != server_args.speculative_num_steps + 1):
            log.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")
            server_args.speculative_num_draft_tokens = server_args.speculative_num_steps + 1
    elif server_args.speculative_algorithm == "NGRAM":
        if server_args.max_running_requests is None:
            server_args.max_running_requests = 48
            log.warning(
                "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests.")
        if env_v2_era:
            server_args.disable_overlap_schedule = True
        server_args.enable_mixed_chunk = False
        server_args.speculative_eagle_topk = server_args.speculative_ngram_max_bfs_breadth
        if server_args.speculative_num_draft_tokens is None:
            server_args.speculative_num_draft_tokens = 12
            log.warning(
                "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
                "You can override this by explicitly setting --speculative-num-draft-tokens.")
        if server_args.speculative_num_steps is None:
            server_args.speculative_num_steps = (
                server_args.speculative_num_draft_tokens // server_args.speculative_eagle_topk)
        if env_v2_era:
            log.warning("The overlap scheduler and mixed chunked prefill are disabled because of "
                        "using ngram speculative decoding.")
        else:
            log.warning("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
    # The attention-backend auto-selection of these versions needs their
    # resolution pipeline; pick what it picks for an MHA model on Hopper.
    if getattr(server_args, "attention_backend", None) is None:
        topk_one = server_args.speculative_eagle_topk in (None, 1) and (server_args.page_size or 1) == 1
        server_args.attention_backend = "fa3" if topk_one else "flashinfer"


def check_server_args(server_args):
    """ServerArgs.check_server_args, run from the tree for 0.5.7 - 0.5.12. For
    0.5.15+ the real one needs state of the arg_groups resolution pipeline
    (not in the tree), so only its node-count and pipeline-parallel
    assertions run."""
    cls = type(server_args)
    if getattr(cls, "_handle_speculative_decoding", None) is not None:
        server_args.check_server_args()
        return
    # check_server_args of 0.5.13 - 0.5.18; arg_groups/validation_hook.py from 0.5.19
    assert (
        server_args.tp_size * server_args.pp_size
    ) % server_args.nnodes == 0, "tp_size must be divisible by number of nodes"
    if server_args.pp_size > 1:
        assert (
            server_args.disable_overlap_schedule and server_args.speculative_algorithm is None
        ), "Pipeline parallelism is not compatible with overlap schedule, speculative decoding"


def pick_worker(server_args):
    """The draft worker class (or a factory for 0.5.7's registry), chosen by the
    tree's own spec_info.py."""
    spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
    algo = spec_info.SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
    if hasattr(algo, "create_worker"):
        return algo.create_worker(server_args), None
    # 0.5.7: Scheduler.init_model_worker handles multi-layer EAGLE itself and
    # asks the registry for everything else.
    enable_overlap = not server_args.disable_overlap_schedule
    if server_args.enable_multi_layer_eagle:
        if enable_overlap:
            mod = importlib.import_module("sglang.srt.speculative.multi_layer_eagle_worker_v2")
            return mod.MultiLayerEagleWorkerV2, None
        mod = importlib.import_module("sglang.srt.speculative.multi_layer_eagle_worker")
        return mod.MultiLayerEagleWorker, None
    extra = {"enable_overlap": enable_overlap} if algo.is_eagle() else {}
    return None, (algo, extra)


def construct_worker(server_args_mod, server_args, tp_rank, dp_rank):
    """What Scheduler.init_model_worker does for one rank."""
    set_global = getattr(server_args_mod, "set_global_server_args_for_scheduler", None)
    if set_global is not None:
        set_global(server_args)
    nccl_port = 30000 + 1000 + random.randint(0, 999)
    gpu_id = server_args.base_gpu_id + tp_rank * server_args.gpu_id_step
    target = TpModelWorker(server_args=server_args, gpu_id=gpu_id, tp_rank=tp_rank, moe_ep_rank=0,
                           pp_rank=0, dp_rank=dp_rank, nccl_port=nccl_port)
    kwargs = dict(server_args=server_args, gpu_id=gpu_id, tp_rank=tp_rank, moe_ep_rank=0,
                  nccl_port=nccl_port, target_worker=target, dp_rank=dp_rank,
                  attn_cp_rank=0, moe_dp_rank=0,
                  ps=ParallelState(tp_rank=tp_rank, tp_size=max(1, int(server_args.tp_size or 1)),
                                   dp_rank=dp_rank, gpu_id=gpu_id))
    # Modules the real scheduler imports whatever the path (scheduler.py,
    # overlap_utils.py): a broken one fails every launch, as in SGLang.
    for name in ("sglang.srt.speculative.spec_info", "sglang.srt.speculative.spec_utils"):
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    worker_cls, registry = pick_worker(server_args)
    if worker_cls is not None:
        return worker_cls(**_accepted(worker_cls, kwargs))
    algo, extra = registry
    kwargs07 = {k: kwargs[k] for k in ("server_args", "gpu_id", "tp_rank", "moe_ep_rank",
                                       "nccl_port", "target_worker", "dp_rank")}
    kwargs07.update(extra)
    return algo.create_draft_worker(**kwargs07)


def _accepted(cls, kwargs):
    """The scheduler's draft-worker kwargs that this version's __init__ takes."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


# engine.py's redact_watermark_secrets (sampling/watermarking/core.py, 0.5.22+):
# in the dict it dumps, these keys read "<redacted>" whatever their value.
WATERMARK_SECRET_FIELD_NAMES = ("watermark_key", "watermark_key_b", "watermark_config")


def server_args_line(server_args):
    """engine.py's dump: `server_args=ServerArgs(...)` (the dataclass repr) through
    0.5.18, `server_args={...}` (resolved_dict(), field by field) from 0.5.19
    (fields of the msgspec Struct from 0.5.20), its watermark secrets redacted
    from 0.5.22."""
    if _version_tuple() < (0, 5, 19):
        return "server_args=%r" % (server_args,)
    fields = dict((name, getattr(server_args, name, None)) for name in record_fields(server_args))
    if _version_tuple() >= (0, 5, 22):
        for name in WATERMARK_SECRET_FIELD_NAMES:
            if name in fields:
                fields[name] = "<redacted>"
    return "server_args=%r" % (fields,)


def _sglang_version():
    try:
        from importlib import metadata
        return metadata.version("sglang")
    except Exception:
        try:
            return importlib.import_module("sglang.version").__version__
        except Exception:
            return "unknown"


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------

class _State(object):
    ready = False
    warming = False         # the warmup request is being served (before ready)
    loop = None             # standin_steps.StepLoop: the scheduler loop
    server_args = None
    scheduler_info = {}
    version = "unknown"
    workers = []            # the constructed draft worker of each TP rank (of this node)
    node = None             # _Node: this server's place in a multi-node launch
    schedulers = []         # FLEETPATCH_STANDIN_SPAWN_SCHEDULER: (process, pipe) of each spawned scheduler
    terminating = False     # SIGTERM received: drain, then exit
    fatal = None            # exit code once the scheduler died during a request
    rust_server = False     # SGLANG_RUST_SERVER=1 on 0.5.22+: no uvicorn, the Rust ready line


# ---------------------------------------------------------------------------
# Generation: requests, loads, and the worker's real forward_batch_generation
# ---------------------------------------------------------------------------

_WORDS = ("Paris", ".", " It", " is", " the", " capital", " of", " France", ",", " and")


class _Scheduler(object):
    """Running and waiting requests, as the real scheduler counts them.

    A request waits until one of ``max_running_requests`` slots is free, then
    runs; the counts are what /v1/loads and /get_load report and what the
    SIGTERM watchdog waits for."""

    def __init__(self):
        self.lock = threading.Lock()
        self.forward_lock = threading.Lock()  # one scheduler loop: forwards are serial
        self.slots = None
        self.running = {}   # rid -> start time
        self.waiting = {}

    def setup(self, max_running):
        self.slots = threading.Semaphore(max(1, int(max_running)))

    def unfinished(self):
        with self.lock:
            return list(self.waiting) + list(self.running)

    def counts(self):
        with self.lock:
            return len(self.running), len(self.waiting)

    def enter(self, rid):
        with self.lock:
            self.waiting[rid] = time.time()
        self.slots.acquire()
        with self.lock:
            self.waiting.pop(rid, None)
            self.running[rid] = time.time()

    def leave(self, rid):
        with self.lock:
            started = self.running.pop(rid, None)
        if started is not None:
            self.slots.release()


_SCHED = _Scheduler()


def _loads_v1():
    """GET /v1/loads of 0.5.9 (sglang/srt/entrypoints/v1_loads.py)."""
    running, waiting = _SCHED.counts()
    max_running = (_State.server_args.max_running_requests if _State.server_args else None) or 48
    load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_used_tokens": 0, "max_total_num_tokens": _State.scheduler_info.get("max_total_num_tokens", 0),
            "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
            "utilization": round(running / float(max_running), 4), "max_running_requests": max_running,
            "num_total_reqs": running + waiting}
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "version": _State.version, "dp_rank_count": 1, "loads": [load],
            "aggregate": {"total_running_reqs": running, "total_waiting_reqs": waiting,
                          "total_reqs": running + waiting, "avg_token_usage": 0.0,
                          "avg_throughput": 0.0, "avg_utilization": load["utilization"]}}


def _load_deprecated():
    """GET /get_load: one GetLoadReqOutput per DP rank."""
    running, waiting = _SCHED.counts()
    return [{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting,
             "num_tokens": 0, "ts_tic": time.perf_counter()}]


class _Mode(object):
    """ForwardMode EXTEND or DECODE (the real enum lives outside the tree)."""

    def __init__(self, extend):
        self.extend = extend

    def __getattr__(self, attr):
        if attr == "is_extend":
            return lambda *a, **k: self.extend
        if attr == "is_decode":
            return lambda *a, **k: not self.extend
        if attr.startswith("is_"):
            return lambda *a, **k: False
        raise AttributeError(attr)

    def __repr__(self):
        return "ForwardMode.%s" % ("EXTEND" if self.extend else "DECODE")


class _Req(_StubBase):
    """A request of a ScheduleBatch: only plain sampling (no grammar, logprobs,
    hidden states, penalties, logit_bias)."""

    def __init__(self, rid, max_new_tokens):
        self.rid = rid
        self.grammar = None
        self.return_logprob = False
        self.return_hidden_states = False
        self.sampling_params = types.SimpleNamespace(
            max_new_tokens=max_new_tokens, frequency_penalty=0.0, presence_penalty=0.0,
            repetition_penalty=1.0, logit_bias=None, min_new_tokens=0, temperature=1.0)


class _Batch(_StubBase):
    """ScheduleBatch / ModelWorkerBatch with the concrete fields a decision
    about the batch reads; everything else is a stub."""

    def __init__(self, reqs, extend):
        self.reqs = reqs
        self.forward_mode = _Mode(extend)
        self.is_extend_in_batch = extend
        self.has_grammar = False
        self.return_logprob = False
        self.return_hidden_states = False
        # a decode batch carries the draft input of the previous step
        self.spec_info = None if extend else _StepOutput("EagleDraftInput")

    def batch_size(self):
        return len(self.reqs)

    def get_model_worker_batch(self, *args, **kwargs):
        return self


class _StepOutput(_Stub):
    """What a stubbed GPU step returns: an EagleVerifyInput / EagleDraftInput,
    or a tuple of stubs as long as the real method's ``return a, b, c``."""

    def __getattr__(self, attr):
        if attr in ("is_verify_input", "is_draft_input"):
            return lambda *a, **k: True
        return _Stub.__getattr__(self, attr)


def _returned_tuple_len(func):
    """len of the tuple the real method returns (0 if it returns no tuple)."""
    import ast
    import textwrap
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return 0
    body = tree.body[0] if tree.body else None
    stack = list(getattr(body, "body", []))
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            return len(node.value.elts)
        stack.extend(ast.iter_child_nodes(node))
    return 0


# Methods of the draft workers that run the models (CUDA kernels, graphs):
# stubbed on the instance, so forward_batch_generation's own body - and any
# line a patch adds there or in a helper of its own - runs for real.
_GPU_STEPS = ("draft", "draft_forward", "verify", "forward_target_extend", "forward_draft_extend",
              "forward_draft_extend_after_decode", "draft_extend", "_draft_extend_for_prefill",
              "_draft_extend_for_decode", "_prepare_for_speculative_decoding")


def _gpu_step(name, real):
    arity = _returned_tuple_len(real)

    def step(*args, **kwargs):
        if arity:
            return tuple(_StepOutput("%s()[%d]" % (name, i)) for i in range(arity))
        return _StepOutput(name + "()")
    return step


def _stub_gpu_steps(worker):
    objs = [worker]
    try:
        inner = getattr(worker, "draft_worker", None)
    except Exception:
        inner = None
    if inner is not None and inner is not worker and not isinstance(inner, _Stub):
        objs.append(inner)
    for obj in objs:
        for name in _GPU_STEPS:
            real = getattr(type(obj), name, None)
            if callable(real):
                try:
                    object.__setattr__(obj, name, _gpu_step(type(obj).__name__ + "." + name, real))
                except Exception:
                    pass


def _forward(reqs, extend):
    """One scheduler step: every TP rank's worker runs forward_batch_generation.

    An exception there is what kills a real scheduler: logged as such, and
    the server exits 1."""
    if not _State.workers:
        return True
    sa = _State.server_args
    tp_size = max(1, int(sa.tp_size or 1))
    node = _State.node
    with _SCHED.forward_lock:
        sent = node.send_step(reqs, extend) if node is not None else []
        ranks = node.tp_ranks if node is not None else range(len(_State.workers))
        try:
            for tp_rank, worker in zip(ranks, _State.workers):
                _RANK.update(tp_rank=tp_rank, tp_size=tp_size)
                if tp_size > 1:
                    configure_logging(sa, _rank_prefix(sa, tp_rank, None))
                worker.forward_batch_generation(_Batch(list(reqs), extend))
        except Exception:
            logging.getLogger("sglang.srt.managers.scheduler").error(
                "Scheduler hit an exception: %s" % get_exception_traceback())
            configure_logging(sa)
            logging.getLogger("sglang.srt.entrypoints.engine").error(
                "Received sigquit from a child process. It usually means the child failed.")
            _flush()
            _State.fatal = 1
            return False
        finally:
            if tp_size > 1:
                configure_logging(sa)
        if sent:
            node.wait_step(sent)
        return True


def _token_seconds():
    return max(0.0, _env_float("FLEETPATCH_STANDIN_TOKEN_SECONDS", 0.01))


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def server_info():
    sa = _State.server_args
    info = {name: _jsonable(getattr(sa, name, None)) for name in record_fields(sa)}
    info.update(_State.scheduler_info)
    info["internal_states"] = [{}]
    info["version"] = _State.version
    return info


class _Handler(UvicornHandler):
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            if _State.terminating:
                logging.getLogger("sglang.srt.entrypoints.http_server").info(
                    "Health check request received during shutdown. Returning 503.")
                self.send_body(503)
            else:
                self.send_body(200 if _State.ready else 503)
        elif path == "/v1/loads":
            self.send_body(200, json.dumps(_loads_v1()).encode())
        elif path == "/get_load":
            logging.getLogger("sglang.srt.entrypoints.http_server").warning(
                "Endpoint '/get_load' is deprecated and will be removed in a future version. "
                "Please use '/v1/loads' instead.")
            self.send_body(200, json.dumps(_load_deprecated()).encode())
        elif path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":
                logging.getLogger("sglang.srt.entrypoints.http_server").warning(
                    "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                    "Please use '/server_info' instead.")
            self.send_body(200, json.dumps(server_info()).encode())
        elif path in ("/model_info", "/get_model_info"):
            sa = _State.server_args
            self.send_body(200, json.dumps({"model_path": sa.model_path, "tokenizer_path": sa.tokenizer_path,
                                        "is_generation": True}).encode())
        else:
            self.send_body(404, b'{"detail":"Not Found"}')

    do_HEAD = do_GET

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        if path != "/generate":
            self.send_body(404, b'{"detail":"Not Found"}')
            return
        if _State.fatal is not None:
            self.close_connection = True
            return
        if not (_State.ready or _State.warming):
            self.send_body(503, b'{"detail":"server is not ready"}')
            return
        refused = os.environ.get("FLEETPATCH_STANDIN_GENERATE_STATUS")
        if refused:   # a test's server that answers /generate with this status
            self.send_body(int(refused), b"the stand-in refuses /generate (FLEETPATCH_STANDIN_GENERATE_STATUS)\n"
                                     b"second line")
            return
        try:
            req = json.loads(raw.decode("utf-8") or "null")
            if not isinstance(req, dict):
                raise ValueError("body is not a JSON object")
            params = req.get("sampling_params") or {}
            n = int(params.get("max_new_tokens", 128))
            if n < 0:
                raise ValueError("max_new_tokens must be >= 0")
        except (ValueError, TypeError, AttributeError) as e:
            self.send_body(422, json.dumps({"detail": "invalid request: %s" % e}).encode())
            return
        self._generate(req, n)

    def _generate(self, req, n):
        """One request through the scheduler loop (standin_steps.StepLoop): prefilled in the
        next step's EXTEND batch, then one token per DECODE step with everything in flight."""
        rid = "%032x" % random.getrandbits(128)
        prompt = req.get("text") if isinstance(req.get("text"), str) else ""
        prompt_tokens = max(1, len(prompt.split()))
        stream = bool(req.get("stream"))
        started = time.time()
        _SCHED.enter(rid)
        try:
            request = _steps.Request(_Req(rid, n), n)
            request.prompt_tokens = prompt_tokens
            _State.loop.submit(request)
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
            text = ""
            while True:
                kind, count = request.events.get()
                if kind == "failed":
                    return self._die()
                if count:
                    text += _WORDS[(count - 1) % len(_WORDS)]
                done = kind == "done"
                if stream and (count or done):
                    self.send_chunk(b"data: " + json.dumps(self._out(rid, text, count, prompt_tokens, started, done)).encode() + b"\n\n")
                if done:
                    break
            if stream:
                self.send_chunk(b"data: [DONE]\n\n")
                self.send_chunk(b"")
            else:
                self.send_body(200, json.dumps(self._out(rid, text, n, prompt_tokens, started, True)).encode())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: abort, as SGLang does
        finally:
            _SCHED.leave(rid)

    def _out(self, rid, text, n, prompt_tokens, started, done):
        return {"text": text, "output_ids": list(range(n)),
                "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": n} if done else None,
                              "prompt_tokens": prompt_tokens, "completion_tokens": n, "cached_tokens": 0,
                              "e2e_latency": round(time.time() - started, 4)}}

    def _die(self):
        # the scheduler died: the connection is dropped, no answer
        self.close_connection = True

    def log_request(self, code="-", size="-"):
        # uvicorn's access log line (the Rust server logs none)
        if _State.rust_server:
            return
        logging.getLogger("uvicorn.access").info("INFO:     " + self.access_text(code))


# ---------------------------------------------------------------------------
# Multi-node: --nnodes N --node-rank R --dist-init-addr HOST:PORT
# ---------------------------------------------------------------------------

# torch.distributed's errors, named as a traceback prints them.
class DistError(RuntimeError):
    pass


class DistStoreError(DistError):
    pass


class DistNetworkError(DistError):
    pass


for _cls in (DistError, DistStoreError, DistNetworkError):
    _cls.__module__ = "torch.distributed"

# What torch's store client raises when the other end of its connection has closed.
_CLOSED = "Failed to recv, got 0 bytes. Connection was likely closed."


class _Link(object):
    """One rendezvous connection: JSON lines over TCP."""

    def __init__(self, conn):
        self.conn = conn
        self.buf = b""

    def send(self, msg):
        self.conn.sendall(json.dumps(msg).encode() + b"\n")

    def recv(self, deadline):
        """The next message; socket.timeout at the deadline, EOFError when the other side is gone."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            self.conn.settimeout(left)
            data = self.conn.recv(65536)
            if not data:
                raise EOFError(_CLOSED)
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line.decode("utf-8"))

    def close(self):
        try:
            self.conn.close()
        except OSError:
            pass


class _Node(object):
    """This server's node in a multi-node launch, and its rendezvous."""

    def __init__(self, server_args):
        self.nnodes = max(1, int(getattr(server_args, "nnodes", 1) or 1))
        self.rank = int(getattr(server_args, "node_rank", 0) or 0)
        tp_size = max(1, int(server_args.tp_size or 1))
        pp_size = max(1, int(getattr(server_args, "pp_size", 1) or 1))
        # engine.py's rank ranges (_launch_scheduler_processes / _calculate_rank_ranges)
        nodes_per_pp_rank = max(self.nnodes // pp_size, 1)
        pp_per_node = max(pp_size // self.nnodes, 1)
        tp_per_node = tp_size // nodes_per_pp_rank
        first_tp = tp_per_node * (self.rank % nodes_per_pp_rank)
        first_pp = pp_per_node * (self.rank // nodes_per_pp_rank)
        self.tp_ranks = list(range(first_tp, first_tp + tp_per_node))
        self.world_size = tp_size * pp_size
        # ModelRunner: rank = tp_size * pp_rank + tp_rank
        self.ranks = [tp_size * pp + tp for pp in range(first_pp, first_pp + pp_per_node) for tp in self.tp_ranks]
        self.peers = []        # node 0: the link of every other node that joined
        self.link = None       # node R >= 1: the link to node 0
        self.store = None      # node 0: the listening socket, open as long as the server lives
        self.addr = _dist_init_addr(server_args) if self.nnodes > 1 else None
        self.timeout = _dist_timeout(server_args)

    @property
    def multi(self):
        return self.nnodes > 1

    def rendezvous(self):
        """Every rank joins before any goes on: init_process_group's TCPStore."""
        init = logging.getLogger("sglang.srt.model_executor.model_runner")
        newest = _version_tuple() >= (0, 5, 21)   # distributed/bootstrap.py's init_parallel_runtime
        init.info("Init parallel begin." if newest else "Init torch distributed begin.")
        started = time.monotonic()
        deadline = started + self.timeout
        if self.rank == 0:
            self._serve_store(deadline)
        else:
            self._join_store(deadline)
        elapsed = time.monotonic() - started
        if newest:
            init.info("Init parallel ends. elapsed=%.2f s" % elapsed)
        elif _version_tuple() >= (0, 5, 9):
            init.info("Init torch distributed ends. elapsed=%.2f s, mem usage=0.09 GB" % elapsed)
        else:
            init.info("Init torch distributed ends. mem usage=0.09 GB")

    def _serve_store(self, deadline):
        host, port = self.addr
        v6 = ":" in host
        store = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # like the TCPStore server: every interface, whatever HOST names
            store.bind(("::" if v6 else "0.0.0.0", port))
            store.listen(64)
        except OSError as e:
            store.close()
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. port: %d, useIpv6: %s, "
                "code: %d, name: %s, message: %s" % (port, str(v6).lower(), -(e.errno or 0),
                                                    errno.errorcode.get(e.errno, "?"), (e.strerror or "").lower())) from None
        self.store = store
        joined = set(self.ranks)
        while len(joined) < self.world_size:
            if time.monotonic() >= deadline:
                raise DistStoreError("Timed out after %d seconds waiting for clients. %d/%d clients joined."
                                     % (int(self.timeout) + 1, len(joined), self.world_size))
            store.settimeout(max(0.01, min(0.5, deadline - time.monotonic())))
            try:
                conn, _ = store.accept()
            except socket.timeout:
                continue
            link = _Link(conn)
            try:
                hello = link.recv(min(deadline, time.monotonic() + 5))
                ranks = set(int(r) for r in hello["ranks"])
            except (socket.timeout, EOFError, OSError, ValueError, KeyError, TypeError):
                link.close()
                continue
            if not ranks or ranks & joined or not all(0 <= r < self.world_size for r in ranks):
                link.close()   # a rank twice, or none of this world: not a member
                continue
            joined |= ranks
            self.peers.append(link)
        for link in list(self.peers):
            try:
                link.send({"go": self.world_size})
            except OSError:
                self.peers.remove(link)
        # Connections after this are held by the kernel and never answered: a late
        # node waits out its deadline, as against a world that has formed.

    def _join_store(self, deadline):
        host, port = self.addr
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistNetworkError("The client socket has timed out after %dms while trying to connect "
                                       "to (%s, %d)." % (int(self.timeout * 1000), host, port))
            try:
                conn = socket.create_connection((host, port), timeout=min(left, 2.0))
                break
            except OSError:
                time.sleep(min(0.1, max(0.0, left)))
        link = _Link(conn)
        try:
            link.send({"node_rank": self.rank, "ranks": self.ranks})
            link.recv(deadline)
        except socket.timeout:
            link.close()
            raise DistStoreError("Socket Timeout") from None
        except (EOFError, OSError):
            link.close()
            raise DistNetworkError(_CLOSED) from None
        conn.settimeout(None)
        self.link = link

    def send_step(self, reqs, extend):
        """Node 0: the step its workers run, to every other node (before its own)."""
        msg = {"forward": bool(extend), "reqs": [[r.rid, r.sampling_params.max_new_tokens] for r in reqs]}
        sent = []
        for link in list(self.peers):
            try:
                link.send(msg)
                sent.append(link)
            except OSError:
                self._drop(link)
        return sent

    def wait_step(self, sent):
        """Node 0: every node that took the step has run it; one that died is left out (#3099)."""
        for link in sent:
            try:
                link.recv(time.monotonic() + 30)
            except (socket.timeout, EOFError, OSError, ValueError):
                self._drop(link)

    def _drop(self, link):
        link.close()
        if link in self.peers:
            self.peers.remove(link)

    def shutdown(self):
        """Node 0, 0.5.21+: the ShutdownReq broadcast that stops every node's schedulers."""
        for link in list(self.peers):
            try:
                link.send({"shutdown": True})
            except OSError:
                pass


def _dist_init_addr(server_args):
    addr = getattr(server_args, "dist_init_addr", None)
    if not addr:
        # ModelRunner: tcp://127.0.0.1:<nccl_port>, a port of this node's own, so
        # nodes launched without --dist-init-addr never meet and time out.
        return "127.0.0.1", int(getattr(server_args, "nccl_port", None) or get_free_port())
    if addr.startswith("["):
        host, _, port = addr[1:].partition("]:")
    else:
        host, _, port = addr.rpartition(":")
    return host, int(port)


def _dist_timeout(server_args):
    seconds = _env_float("FLEETPATCH_STANDIN_DIST_TIMEOUT", None)
    if seconds is None:
        seconds = getattr(server_args, "dist_timeout", None)
    # torch's default for an NCCL process group (default_pg_nccl_timeout): 10 minutes
    return float(seconds) if seconds else 600.0


def _fail_after(node):
    """FLEETPATCH_STANDIN_FAIL_RANK: seconds until this node's scheduler dies, or None."""
    wanted = os.environ.get("FLEETPATCH_STANDIN_FAIL_RANK", "").strip()
    if not wanted.isdigit() or int(wanted) != node.rank:
        return None
    return max(0.0, _env_float("FLEETPATCH_STANDIN_FAIL_AFTER_S", 0.0))


def _scheduler_died(server_args, tp_rank):
    """In an except block: what SGLang logs when a scheduler raises, and the exit code."""
    configure_logging(server_args, _rank_prefix(server_args, tp_rank, None))
    logging.getLogger("sglang.srt.managers.scheduler").error(
        "Scheduler hit an exception: %s" % get_exception_traceback())
    configure_logging(server_args)
    logging.getLogger("sglang.srt.entrypoints.engine").error(
        "Received sigquit from a child process. It usually means the child failed.")
    _flush()
    return 1


class _DummyHealthHandler(_Handler):
    """utils/common.py's launch_dummy_health_check_server (every release 0.5.7 -
    0.5.23): a FastAPI app with GET /ping, /health, /health_generate answering 200;
    uvicorn at log_level "warning", so no access lines."""

    ROUTES = ("/ping", "/health", "/health_generate")

    def do_GET(self):
        if self.path.split("?", 1)[0] in self.ROUTES:
            self.send_body(200)
        else:
            self.send_body(404, b'{"detail":"Not Found"}')

    do_HEAD = do_GET

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.split("?", 1)[0] in self.ROUTES:
            self.send_body(405, b'{"detail":"Method Not Allowed"}')
        else:
            self.send_body(404, b'{"detail":"Not Found"}')

    def log_request(self, code="-", size="-"):
        pass


def _host_port(host, port):
    # 0.5.10+ logs NetworkAddress(host, port).to_host_port_str(): IPv6 in brackets
    if ":" in host and _version_tuple() >= (0, 5, 10):
        return "[%s]:%s" % (host, port)
    return "%s:%s" % (host, port)


def _on_sigterm_follower(signum, frame):
    # engine.py 0.5.21+: a node R >= 1 waits for node 0's ShutdownReq broadcast;
    # before, SIGTERM ended it at once.
    if _version_tuple() < (0, 5, 21):
        raise _Stop()
    logging.getLogger("sglang.srt.entrypoints.engine").warning(
        "SIGTERM received on node_rank %d; waiting for the rank-0 ShutdownReq broadcast to stop "
        "the schedulers." % _State.node.rank)


def follow(node, server_args):
    """A node R >= 1 after its workers are built (engine.py, node_rank >= 1): the
    dummy health server on --port, then the steps node 0 sends, until it goes."""
    host = server_args.host or "127.0.0.1"
    httpd = make_http_server(host, int(server_args.port), _DummyHealthHandler)
    threading.Thread(target=httpd.serve_forever, name="health-check-server", daemon=True).start()
    logging.getLogger("sglang.srt.utils.common").info(
        "Dummy health check server started in background thread at %s" % _host_port(host, server_args.port))
    _flush()
    signal.signal(signal.SIGTERM, _on_sigterm_follower)
    fail_after = _fail_after(node)
    dies_at = None if fail_after is None else time.monotonic() + fail_after
    first = node.tp_ranks[0]
    try:
        while True:
            if dies_at is not None and time.monotonic() >= dies_at:
                try:
                    raise RuntimeError("CUDA error: an illegal memory access was encountered "
                                       "(stand-in FLEETPATCH_STANDIN_FAIL_RANK=%d)" % node.rank)
                except RuntimeError:
                    return _scheduler_died(server_args, first)
            step = 0.2 if dies_at is None else max(0.01, min(0.2, dies_at - time.monotonic()))
            if node.link is None:   # --node-rank >= 1 with --nnodes 1: nobody to follow
                time.sleep(step)
                continue
            try:
                msg = node.link.recv(time.monotonic() + step)
            except socket.timeout:
                continue
            except (EOFError, OSError):
                # node 0 is gone: the scheduler's next broadcast over gloo fails
                try:
                    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
                                       "by peer [%s]:%d" % node.addr) from None
                except RuntimeError:
                    return _scheduler_died(server_args, first)
            if msg.get("shutdown"):
                for _ in node.tp_ranks:
                    logger.error("Scheduler or DataParallelController %d terminated with 0" % os.getpid())
                return 0
            reqs = [_Req(rid, n) for rid, n in msg.get("reqs", [])]
            if not _forward(reqs, msg.get("forward")):
                return _State.fatal
            node.link.send({"ok": True})
    finally:
        httpd.server_close()


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def _on_sigterm_serving(signum, frame):
    # SGLang's SignalHandler.sigterm_handler: only a flag; the watchdog exits
    if not _State.terminating:
        logging.getLogger("sglang.srt.managers.tokenizer_manager").warning(
            "SIGTERM received. signum=%r frame=%r. Draining requests and shutting down..."
            % (signum, frame))
    _State.terminating = True


def _serve_until_stopped(exit_after, reason="FLEETPATCH_STANDIN_EXIT_AFTER_READY"):
    """The serving phase: returns the exit code.

    SIGTERM as in 0.5.9's TokenizerManager.sigterm_watchdog: every
    FLEETPATCH_STANDIN_SIGTERM_POLL seconds (SGLang: 5) the unfinished
    requests are counted and logged; the server exits 0 once there are none.
    Meanwhile /health answers 503 and new /generate requests are served."""
    signal.signal(signal.SIGTERM, _on_sigterm_serving)
    log = logging.getLogger("sglang.srt.managers.tokenizer_manager")

    def drained():
        rids = _SCHED.unfinished()
        log.info("Gracefully exiting... Remaining number of requests %d. Remaining requests "
                 "remaining_rids=%r." % (len(rids), rids))
        _flush()
        return not rids

    def died():
        try:
            raise RuntimeError("stand-in scheduler died (%s)" % reason)
        except RuntimeError:
            logging.getLogger("sglang.srt.managers.scheduler").error(
                "Scheduler hit an exception: %s" % get_exception_traceback())
            logging.getLogger("sglang.srt.entrypoints.engine").error(
                "Received sigquit from a child process. It usually means the child failed.")
            _flush()
            return 1

    return serve_until_stopped(fatal=lambda: _State.fatal, terminating=lambda: _State.terminating,
                               drained=drained, poll=max(0.05, _env_float("FLEETPATCH_STANDIN_SIGTERM_POLL", 0.5)),
                               exit_after=exit_after, on_deadline=died)


def rust_server_serves():
    """SGLANG_RUST_SERVER=1 on 0.5.22+: the Rust extension serves HTTP, runs the
    warm-up and prints the ready line itself; Python's http_server never starts.
    (0.5.17 - 0.5.21 still log Python's ready line after its warm-up.)"""
    try:
        wanted = _parse_env_bool(os.environ.get("SGLANG_RUST_SERVER", "false"))
    except ValueError:
        wanted = False  # EnvBool: an invalid value reads as the default
    return wanted and _version_tuple() >= (0, 5, 22)


def _prefill_log(new, running):
    """The scheduler's line for a prefill (EXTEND) batch of `new` requests."""
    logging.getLogger("sglang.srt.managers.scheduler").info(
        "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: 0, token usage: 0.00, "
        "#running-req: %d, #queue-req: %d, " % (len(new), sum(getattr(r, "prompt_tokens", 1) for r in new),
                                                running, _SCHED.counts()[1]))


def _warmed_up(server_args, shown_host, port):
    """_wait_and_warmup: SGLang's warmup request through the server itself (standin_steps.warmup)
    before "ready", unless --skip-server-warmup. False: it failed (logged), the server exits."""
    if getattr(server_args, "skip_server_warmup", False):
        return True
    _State.warming = True
    try:
        ok = _steps.warmup("http://%s:%s" % (shown_host, port), getattr(server_args, "api_key", None),
                           logging.getLogger("sglang.srt.entrypoints.http_server"))
    finally:
        _State.warming = False
    if not ok:
        _flush()
        _State.fatal = _State.fatal or 1
    return ok and _State.fatal is None


def _python_ready():
    _State.ready = True
    logging.getLogger("sglang.srt.entrypoints.http_server").info("The server is fired up and ready to roll!")
    _flush()


def _rust_ready():
    """The Rust server's ready line (sglang-server's api_server/http/app.rs): the
    same text as Python's, in tracing-subscriber's format, on stdout. The wheel
    holds the text; the format is the stand-in's reading of the crate (tracing)."""
    _State.ready = True
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%06dZ" % int((now % 1) * 1e6)
    _flush()
    sys.stdout.write("%s  INFO sglang_server::api_server::http::app: "
                     "The server is fired up and ready to roll!\n" % stamp)
    _flush()


def _spawned_scheduler(argv, tp_rank, dp_rank, conn):
    """A scheduler process (multiprocessing spawn): build this rank's worker with the
    tree's real code, say its token budget, then live as long as the server does."""
    install_stubs()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    os.dup2(devnull, 2)   # the routing warnings were printed once, by the server
    try:
        server_args_mod, server_args = build_server_args(argv)
        apply_routing(server_args)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    tp_size = max(1, int(server_args.tp_size or 1))
    _RANK.update(tp_rank=tp_rank, tp_size=tp_size)
    configure_logging(server_args, _rank_prefix(server_args, tp_rank, dp_rank))
    try:
        worker = construct_worker(server_args_mod, server_args, tp_rank, dp_rank)
        conn.send(("ok", getattr(getattr(worker, "target_worker", None), "max_total_num_tokens", 400000)))
    except Exception:
        conn.send(("error", get_exception_traceback()))
        return
    try:
        conn.recv()   # EOF (or anything): the server is gone
    except (EOFError, OSError):
        pass


def spawn_scheduler(argv, tp_rank, dp_rank):
    """Build one rank's worker in a spawned scheduler process; its max_total_num_tokens."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_spawned_scheduler, args=(argv, tp_rank, dp_rank, there), daemon=True,
                       name="scheduler_TP%d" % tp_rank)
    proc.start()
    there.close()
    _State.schedulers.append((proc, here))
    status, value = here.recv()
    if status != "ok":
        raise RuntimeError("the spawned scheduler failed:\n" + value)
    return value


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    line_buffer_streams()
    stop_on_signals()
    httpd = None
    try:
        install_stubs()
        server_args_mod, server_args = build_server_args(argv)
        # Warnings of the routing reach stderr bare: logging is not configured yet.
        apply_routing(server_args)
        _flush()

        configure_logging(server_args)
        check_server_args(server_args)
        logger.info(server_args_line(server_args))

        rotate = os.environ.get("FLEETPATCH_STANDIN_ROTATE_LOG")
        if rotate:
            rotate_log(rotate)

        _State.server_args = server_args
        _State.version = _sglang_version()
        node = _State.node = _Node(server_args)
        sched_log = logging.getLogger("sglang.srt.managers.scheduler")
        tp_size = max(1, int(server_args.tp_size or 1))
        dp_rank = 0 if (getattr(server_args, "dp_size", 1) or 1) > 1 else None
        for tp_rank in node.tp_ranks:
            _RANK.update(tp_rank=tp_rank, tp_size=tp_size)
            configure_logging(server_args, _rank_prefix(server_args, tp_rank, dp_rank))
            try:
                if node.multi and tp_rank == node.tp_ranks[0]:
                    node.rendezvous()
                if server_args.speculative_algorithm is not None and _env_true("FLEETPATCH_STANDIN_SPAWN_SCHEDULER"):
                    max_total = spawn_scheduler(argv, tp_rank, dp_rank)
                elif server_args.speculative_algorithm is not None:
                    worker = construct_worker(server_args_mod, server_args, tp_rank, dp_rank)
                    _stub_gpu_steps(worker)
                    _State.workers.append(worker)
                    max_total = getattr(getattr(worker, "target_worker", None), "max_total_num_tokens", 400000)
                else:
                    target = TpModelWorker(server_args=server_args, gpu_id=tp_rank, tp_rank=tp_rank)
                    max_total = target.max_total_num_tokens
                if _env_true("FLEETPATCH_STANDIN_CRASH_AFTER_INIT"):
                    raise RuntimeError("CUDA error: an illegal memory access was encountered "
                                       "(stand-in FLEETPATCH_STANDIN_CRASH_AFTER_INIT)")
                sched_log.info(
                    "max_total_num_tokens=%s, chunked_prefill_size=%s, max_prefill_tokens=%s, "
                    "max_running_requests=%s, context_len=%s, available_gpu_mem=%.2f GB"
                    % (max_total, server_args.chunked_prefill_size, server_args.max_prefill_tokens,
                       server_args.max_running_requests or 48, server_args.context_length or 131072,
                       get_available_gpu_memory()))
                _State.scheduler_info = {"status": "ready", "max_total_num_tokens": max_total,
                                         "max_req_input_len": max_total - 6}
            except Exception:
                sched_log.error("Scheduler hit an exception: %s" % get_exception_traceback())
                configure_logging(server_args)
                logging.getLogger("sglang.srt.entrypoints.engine").error(
                    "Received sigquit from a child process. It usually means the child failed.")
                _flush()
                return 1
        configure_logging(server_args)
        _SCHED.setup(server_args.max_running_requests or 48)
        _State.loop = _steps.StepLoop(_forward, _prefill_log, _token_seconds())
        if node.rank > 0:
            return follow(node, server_args)

        host = server_args.host or "127.0.0.1"
        httpd = make_http_server(host, int(server_args.port), _Handler)
        threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
        shown_host = "[%s]" % host if ":" in host else host
        rust = _State.rust_server = rust_server_serves()
        if rust:
            logging.getLogger("sglang.srt.rust_server.server").info(
                "SGLANG_RUST_SERVER enabled, Rust server listen on %s:%s" % (shown_host, httpd.server_address[1]))
        else:
            # uvicorn's lines, with SGLang's set_uvicorn_logging_configs format
            uv = logging.getLogger("uvicorn.error")
            uv.info("INFO:     Started server process [%d]" % os.getpid())
            uv.info("INFO:     Waiting for application startup.")
            uv.info("INFO:     Application startup complete.")
            uv.info("INFO:     Uvicorn running on http://%s:%s (Press CTRL+C to quit)"
                    % (shown_host, httpd.server_address[1]))

        time.sleep(max(0.0, _env_float("FLEETPATCH_STANDIN_STARTUP_DELAY", 0.2)))
        if _env_true("FLEETPATCH_STANDIN_NEVER_READY"):
            while True:
                time.sleep(0.2)
        if not _warmed_up(server_args, shown_host, httpd.server_address[1]):
            return 1
        if rust:
            _rust_ready()
        else:
            _python_ready()

        exit_after = _env_float("FLEETPATCH_STANDIN_EXIT_AFTER_READY", None)
        reason = "FLEETPATCH_STANDIN_EXIT_AFTER_READY"
        fail_after = _fail_after(node)
        if fail_after is not None and (exit_after is None or fail_after < exit_after):
            exit_after, reason = fail_after, "FLEETPATCH_STANDIN_FAIL_RANK=0"
        rc = _serve_until_stopped(exit_after, reason)
        if rc == 0 and _State.terminating and _version_tuple() >= (0, 5, 21):
            node.shutdown()
        return rc
    except _Stop:
        _flush()
        return 0
    finally:
        if httpd is not None:
            try:
                httpd.server_close()
            except Exception:
                pass
        _flush()


for _name in ("get_bool_env_var", "get_int_env_var", "get_float_env_var", "nullable_str",
              "json_list_type", "parse_connector_type", "next_power_of_2", "human_readable_int", "is_no_spec_infer_or_topk_one", "round_up", "ceil_div",
              "empty_context", "EmptyContextManager", "get_available_gpu_memory",
              "get_device_memory_capacity", "get_device", "get_device_name", "get_device_sm",
              "get_free_port", "torch_release", "get_exception_traceback"):
    _UTILS[_name] = globals()[_name]


if __name__ == "__main__":
    sys.exit(main())
