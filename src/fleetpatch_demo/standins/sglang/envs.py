"""sglang.srt.environ as the stand-in serves it (the real file is not in the host's tree):
``envs`` (an ``Envs``: one ``EnvField`` per variable, typed as in SGLang's environ.py), and
sglang.srt.utils' ``get_bool_env_var`` / ``get_int_env_var`` / ``get_float_env_var``."""
import logging
import os

from fleetpatch_standin_common.stubs import is_dunder


# --- sglang.srt.environ (the real file is not in the tree) -----------------
# Types and defaults of the variables server_args.py and speculative/ read
# (from SGLang's environ.py); other names are parsed leniently.
ENV_TABLE = {
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


def parse_env_bool(value):
    # sglang.srt.environ.EnvBool.parse
    value = value.lower()
    if value in ["true", "1", "yes", "y"]:
        return True
    if value in ["false", "0", "no", "n"]:
        return False
    raise ValueError('"%s" is not a valid boolean value' % value)


def parse_env_lenient(value):
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
            return parse_env_bool(value)
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
        return parse_env_lenient(value)

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


class Envs(object):
    def __getattr__(self, name):
        if is_dunder(name):
            raise AttributeError(name)
        kind, default = ENV_TABLE.get(name, ("any", False))
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
