"""The draft worker of a rank: chosen by the tree's own spec_info.py, constructed with the
scheduler's arguments (every line of its real __init__ runs), its model-running steps
stubbed on the instance (``stub_gpu_steps``) so that forward_batch_generation's own body
runs for real; and the batch objects (``Req``, ``Batch``) a step hands it."""
import importlib
import importlib.util
import inspect
import random
import types

from fleetpatch_standin_common.stubs import Stub, StubBase

from .models import ParallelState, TpModelWorker


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


class Req(StubBase):
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


class Batch(StubBase):
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


class _StepOutput(Stub):
    """What a stubbed GPU step returns: an EagleVerifyInput / EagleDraftInput,
    or a tuple of stubs as long as the real method's ``return a, b, c``."""

    def __getattr__(self, attr):
        if attr in ("is_verify_input", "is_draft_input"):
            return lambda *a, **k: True
        return Stub.__getattr__(self, attr)


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


def stub_gpu_steps(worker):
    objs = [worker]
    try:
        inner = getattr(worker, "draft_worker", None)
    except Exception:
        inner = None
    if inner is not None and inner is not worker and not isinstance(inner, Stub):
        objs.append(inner)
    for obj in objs:
        for name in _GPU_STEPS:
            real = getattr(type(obj), name, None)
            if callable(real):
                try:
                    object.__setattr__(obj, name, _gpu_step(type(obj).__name__ + "." + name, real))
                except Exception:
                    pass
