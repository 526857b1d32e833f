"""What the SGLang stand-in stubs and what it makes concrete: ``STUB_RULES`` (a
fleetpatch_standin_common ``StubRules``) and ``install_stubs()``, which installs them.

* Always stubbed, even if installed (FORCE_STUB): the GPU/ML libraries; and the
  sglang.srt.arg_groups modules the stand-in resolves itself (``standin_resolves``).
* Never stubbed (NEVER_STUB): sglang.srt.speculative, which the tree holds completely.
* Concrete wherever a stub provides the name (BY_NAME), and per module (MODULE_ATTRS):
  sglang.srt.environ, the utils helpers, TpModelWorker, ModelConfig, arg_utils,
  argparse_actions, msgspec."""
from fleetpatch_standin_common.stubs import StubRules
from fleetpatch_standin_common.stubs import install_stubs as install_stub_rules

from .argutils import (DeprecatedAction, DeprecatedAliasStoreAction, DeprecatedStoreConstAction,
                       DeprecatedStoreTrueAction, LoRAPathAction, arg_utils_attrs, print_deprecated_warning)
from .envs import EnvField, Envs, get_bool_env_var, get_float_env_var, get_int_env_var
from .models import ModelConfig, ParallelState, TpModelWorker, resolving_view, runtime_config
from .msgspec_standin import MSGSPEC, MSGSPEC_STRUCTS
from .srtutils import (EmptyContextManager, ceil_div, empty_context, get_available_gpu_memory,
                       get_batch_sizes_to_capture, get_device, get_device_capability,
                       get_device_memory_capacity, get_device_name, get_device_sm, get_exception_traceback,
                       get_free_port, get_model_architecture, get_rank, get_world_size, group_getter,
                       human_readable_int, is_no_spec_infer_or_topk_one, json_list_type, next_power_of_2,
                       nullable_str, pair, parse_connector_type, round_up, torch_release)


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


def standin_resolves(fullname):
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


# Names that have the same meaning wherever a stub module (or stub object)
# provides them.
BY_NAME = {
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
    "get_tp_group": group_getter("tp"),
    "get_attention_tp_group": group_getter("attention_tp"),
    "get_attn_tp_group": group_getter("attention_tp"),
    "get_moe_ep_group": group_getter("moe_ep"),
    "get_moe_tp_group": group_getter("moe_tp"),
    "get_pp_group": group_getter("pp"),
    "get_world_group": group_getter("world"),
    "get_tensor_model_parallel_world_size": get_world_size,
    "get_tensor_model_parallel_rank": get_rank,
    "get_attention_tp_size": get_world_size,
    "get_attention_tp_rank": get_rank,
    "get_embed_and_head": pair,
    "get_batch_sizes_to_capture": get_batch_sizes_to_capture,
    "get_model_architecture": get_model_architecture,
    "get_memory_pool": pair,
    "is_out_of_tree": lambda *a, **k: False,
    "LORA_TARGET_ALL_MODULES": "all",
    "SUPPORTED_LORA_TARGET_MODULES": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
        "qkv_proj", "gate_up_proj", "embed_tokens", "lm_head"],
}


BY_NAME.update(ParallelState=ParallelState, resolving_view=resolving_view,
                **{name: runtime_config for name in ("get_spec", "get_context", "get_exec", "get_model",
                                                      "get_parallel", "get_schedule")})


# the same helpers in sglang.srt.utils and sglang.srt.utils.common
UTILS = {name: BY_NAME[name] for name in (
    "get_bool_env_var", "get_int_env_var", "get_float_env_var", "nullable_str",
    "json_list_type", "parse_connector_type", "next_power_of_2", "human_readable_int",
    "is_no_spec_infer_or_topk_one", "round_up", "ceil_div", "empty_context", "EmptyContextManager",
    "get_available_gpu_memory", "get_device_memory_capacity", "get_device", "get_device_name",
    "get_device_sm", "get_free_port", "torch_release", "get_exception_traceback")}


MODULE_ATTRS = {
    "sglang.srt.environ": {"envs": Envs(), "EnvField": EnvField},
    "sglang.srt.managers.tp_worker": {"TpModelWorker": TpModelWorker},
    "sglang.srt.configs.model_config": {"ModelConfig": ModelConfig},
    "sglang.srt.configs": {"ModelConfig": ModelConfig},
    "sglang.srt.arg_groups.arg_utils": arg_utils_attrs(),
    "sglang.srt.arg_groups.argparse_actions": {
        "LoRAPathAction": LoRAPathAction, "DeprecatedAction": DeprecatedAction,
        "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
        "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
        "DeprecatedAliasStoreAction": DeprecatedAliasStoreAction,
        "print_deprecated_warning": print_deprecated_warning},
    "sglang.srt.utils": UTILS,
    "sglang.srt.utils.common": UTILS,
    "msgspec": MSGSPEC,
    "msgspec.structs": MSGSPEC_STRUCTS,
}


STUB_RULES = StubRules(force_stub=FORCE_STUB, never_stub=NEVER_STUB, true_predicates=TRUE_PREDICATES,
                       concrete=BY_NAME, module_attrs=MODULE_ATTRS, also_stub=standin_resolves)


def install_stubs():
    """The finders on sys.meta_path, with the SGLang stand-in's rules (before the tree is imported)."""
    install_stub_rules(STUB_RULES)
