"""Simulated model-side objects of SGLang: the model config (read from
``<model-path>/config.json``, else a Llama checkpoint), the target ``TpModelWorker`` and its
``ModelRunner``, 0.5.16+'s ``ParallelState`` and 0.5.19+'s runtime-context views."""
import dataclasses
import json
import logging
import os

from fleetpatch_standin_common.stubs import MISSING, Stub, StubBase, is_dunder

from .srtutils import Group, get_available_gpu_memory
from .state import State


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
        if is_dunder(attr):
            raise AttributeError(attr)
        value = getattr(State.server_args, attr, MISSING)
        return Stub("runtime_context." + attr) if value is MISSING else value


def runtime_config(*args, **kwargs):
    return _ConfigView()


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


class ModelConfig(StubBase):
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


class _Model(StubBase):
    def __init__(self, draft=False):
        self.hot_token_id = None
        self.load_lm_head_from_target = False

    def get_embed_and_head(self):
        return (Stub("embed_tokens.weight"), Stub("lm_head.weight"))

    def get_embed(self):
        return Stub("embed_tokens.weight")

    def set_embed_and_head(self, embed, head):
        pass

    def set_embed(self, embed):
        pass


class _ModelRunner(StubBase):
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
        self.tp_group = Group("tp")
        self.attention_tp_group = Group("attention_tp")
        self.req_to_token_pool = req_to_token_pool or Stub("req_to_token_pool")
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator or Stub("token_to_kv_pool_allocator")
        self.token_to_kv_pool = Stub("token_to_kv_pool")
        self.max_total_num_tokens = 400000
        self.max_running_requests = server_args.max_running_requests or 48
        self.sliding_window_size = None
        self.is_hybrid_swa = False
        self.is_hybrid_gdn = False
        self.use_mla_backend = False
        self.spec_algorithm = Stub("spec_algorithm")
        self.attn_backend = Stub("attn_backend")
        self.graph_runner = None
        self.cuda_graph_runner = None
        self.dtype = Stub("torch.bfloat16")


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


class TpModelWorker(StubBase):
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
