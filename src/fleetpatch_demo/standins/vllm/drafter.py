"""The drafter (Model Runner V1: ``vllm/v1/spec_decode/*``) or speculator (Model Runner V2:
``vllm/v1/worker/gpu/spec_decode/<method>/speculator.py``) of the launch, imported from the
host's files, built as the runner builds it, and its propose step run once per engine step.

* V1: the class routing.py picked (gpu_model_runner.py's branches), constructed with
  ``(vllm_config, device, runner)`` as far as its signature takes them; ``load_model`` at start-up.
* V2: the host's REAL ``init_speculator`` (``vllm/v1/worker/gpu/spec_decode/__init__.py``) picks
  and constructs the class; in 0.34+ it resolves ``speculator_config.speculator_class``, which the
  stand-in names from the release's facts (the class of the method's own package).
  ``load_model`` / ``load_draft_model`` at start-up.

Everything the real runner would hand over (tensors, attention metadata, the loaded draft
model) is a stub that absorbs what is done to it; the instance is of an ``absorbing`` subclass,
so an attribute the runner would have set answers a stub.  Every method that runs is the host's.
What a step raises is the step's error: the engine logs it and dies, as vLLM's does.
Stdlib only; Python 3.8+.
"""
import ast
import enum
import importlib
import inspect
import textwrap

from fleetpatch_standin_common.stubs import ValueStub, ValueStubBase

from . import stubs


class Obj(ValueStubBase):
    """A config object: the given fields are concrete, any other is a stub."""

    def __init__(self, name="config", **fields):
        object.__setattr__(self, "_name", name)
        for k, v in fields.items():
            object.__setattr__(self, k, v)

    def __getattr__(self, attr):
        # a setting the launch did not give: off (enable_dbo, lora_config, ...), still absorbing
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = stubs.Off("%s.%s" % (self._name, attr))
        object.__setattr__(self, attr, value)
        return value

    def __repr__(self):
        return "%s(%s)" % (self._name, ", ".join("%s=%r" % (k, v) for k, v in sorted(vars(self).items())
                                                 if not k.startswith("_") and not isinstance(v, (ValueStub, Obj))))


class HfConfig(object):
    """A model's config.json as transformers loads it: the fields it has (a Llama-8B's where the
    model directory has none); a field it lacks is an AttributeError, as on the real object
    (vLLM reads optional ones with getattr(..., default))."""

    DEFAULTS = {"model_type": "llama", "hidden_size": 4096, "vocab_size": 128256, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False}

    def __init__(self, doc, architectures):
        self.__dict__.update(self.DEFAULTS)
        self.__dict__.update({k: v for k, v in (doc or {}).items() if isinstance(k, str) and k.isidentifier()})
        self.architectures = list(architectures)

    def to_dict(self):
        return dict(self.__dict__)


class CompilationLevel(enum.IntEnum):
    """vllm.config's CompilationLevel (0.10.x) / CompilationMode (later): the values compared."""
    NO_COMPILATION = 0
    DYNAMO_AS_IS = 1
    DYNAMO_ONCE = 2
    PIECEWISE = 3


class CompilationMode(enum.IntEnum):
    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


class ModelLayers(object):
    """vllm.config.get_layers_from_vllm_config: the attention layers registered in the config,
    the target model's from the start and the draft model's once it is loaded (the drafter asks
    before and after loading it and keeps the difference). Other layer types: none."""

    TARGET = "model.layers.0.self_attn.attn"
    DRAFT = "draft_model.layers.0.self_attn.attn"

    def __init__(self):
        self.asked = 0

    def __call__(self, vllm_config, layer_type, layer_names=None):
        name = getattr(layer_type, "_stub_name", None) or getattr(layer_type, "__name__", "")
        if "Attention" not in str(name):
            return {}
        self.asked += 1
        out = {self.TARGET: ValueStub(self.TARGET)}
        if self.asked > 1:
            out[self.DRAFT] = ValueStub(self.DRAFT)
        return out


CONFIG_ENUMS = {"CompilationLevel": CompilationLevel, "CompilationMode": CompilationMode}
# vLLM's default CUDA graph capture sizes (1, 2, 4, then steps of 8 up to 512)
CAPTURE_SIZES = [1, 2, 4] + list(range(8, 513, 8))


def vllm_config(model, route, values, bare, tp):
    """The VllmConfig the drafter reads: the launch's settings, stubs for the rest."""
    spec = route.spec
    eager = "enforce-eager" in bare
    model_config = Obj("ModelConfig", model=model, dtype=ValueStub("torch.bfloat16"),
                       max_model_len=int(values.get("max-model-len", 4096)), enforce_eager=eager,
                       is_multimodal_model=False, uses_mrope=False, architectures=route.architectures,
                       hf_config=HfConfig(route.hf_doc, route.architectures),
                       get_hidden_size=lambda: 4096, get_vocab_size=lambda: 128256)
    draft_config = Obj("ModelConfig", model=spec.model if spec else None, dtype=model_config.dtype,
                       max_model_len=model_config.max_model_len, enforce_eager=eager,
                       architectures=spec.draft_architectures if spec else [],
                       hf_config=HfConfig({}, spec.draft_architectures if spec else []),
                       get_hidden_size=lambda: 4096, is_multimodal_model=False, uses_mrope=False)
    if spec is not None:
        object.__setattr__(spec, "draft_model_config", draft_config)
        object.__setattr__(spec, "draft_parallel_config", Obj("ParallelConfig", tensor_parallel_size=tp))
    return Obj("VllmConfig", model_config=model_config, speculative_config=spec,
               cache_config=Obj("CacheConfig", block_size=16),
               scheduler_config=Obj("SchedulerConfig", max_num_batched_tokens=8192, max_num_seqs=256,
                                    max_model_len=model_config.max_model_len),
               parallel_config=Obj("ParallelConfig", tensor_parallel_size=tp, pipeline_parallel_size=1,
                                   data_parallel_size=1, prefill_context_parallel_size=1,
                                   decode_context_parallel_size=1),
               compilation_config=Obj("CompilationConfig", cudagraph_capture_sizes=list(CAPTURE_SIZES),
                                      max_cudagraph_capture_size=CAPTURE_SIZES[-1],
                                      level=CompilationLevel.NO_COMPILATION if eager else CompilationLevel.PIECEWISE,
                                      mode=CompilationMode.NONE if eager else CompilationMode.VLLM_COMPILE),
               pad_for_cudagraph=lambda n: n)


def _optional_params(func):
    """Names of `func`'s parameters annotated `X | None` / `Optional[X]` (read from its source:
    evaluated annotations of stubbed types lose the None)."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(func)))
        fn = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return set()
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    out = set()
    for a in fn.args.args + fn.args.kwonlyargs:
        text = ast.get_source_segment(source, a.annotation) if a.annotation is not None else ""
        if text and ("None" in text or text.startswith("Optional")):
            out.add(a.arg)
    return out


def _call_with(func, given):
    """Call `func` with the `given` keyword values it accepts, None for an optional parameter
    (what the runner passes when the feature is off) and a stub for every other parameter that
    has no default."""
    sig = inspect.signature(func)
    optional = _optional_params(func)
    args, kwargs = [], {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in given:
            value = given[name]
        elif p.default is not p.empty:
            continue
        elif name in optional:
            value = None
        else:
            value = ValueStub(name)
        if p.kind == p.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[name] = value
    return func(*args, **kwargs)


def model_runner():
    """The V1 GPUModelRunner as the drafter sees it: its attention groups hold the target's and
    the draft model's attention layers (ModelLayers), each group's metadata builder a stub."""
    builder = ValueStub("AttentionMetadataBuilder")
    group = Obj("AttentionGroup", layer_names=[ModelLayers.TARGET, ModelLayers.DRAFT], metadata_builder=builder,
                metadata_builders=[builder], get_metadata_builder=lambda *a, **k: builder)
    return Obj("GPUModelRunner", attn_groups=[[group]])


def _v2_class_name(release, method):
    """0.34+: the speculator class named for `method` (the one in the method's own package)."""
    branches = [b for b in release["extracted"]["speculator_branches"]
                if "method == %r" % method in b["when"] or "method == '%s'" % method in b["when"]]
    own = [b for b in branches if "/spec_decode/%s/" % method in b["file"]]
    pick = (own or branches or [None])[0]
    if pick is None:
        return None
    return pick["file"][:-3].replace("/", ".") + "." + pick["class"]


class Drafter(object):
    """The built drafter of one worker (rank): `propose()` runs one step of it."""

    def __init__(self, instance, runner, file, method, num_speculative_tokens):
        self.instance, self.runner, self.file, self.method = instance, runner, file, method
        self.num_speculative_tokens = num_speculative_tokens

    @property
    def class_name(self):
        return type(self.instance).__name__

    def propose(self):
        given = {"dummy_run": False, "is_profile": False, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "eagle3":      # the target model's auxiliary hidden states feed EAGLE-3
            given["aux_hidden_states"] = ValueStub("aux_hidden_states")
        return _call_with(self.instance.propose, given)


def build(release, route, config):
    """Import and construct the launch's drafter from the host's files; load its model (stubbed)."""
    device = ValueStub("torch.device('cuda:0')")
    if route.runner == "v1":
        module = importlib.import_module(route.drafter_file[:-3].replace("/", "."))
        cls = stubs.absorbing(getattr(module, route.drafter))
        runner = model_runner()
        instance = _call_with(cls, {"vllm_config": config, "device": device, "runner": runner})
        file = route.drafter_file
    else:
        qual = _v2_class_name(release, route.method)
        if qual is not None:
            object.__setattr__(route.spec, "speculator_config", Obj("SpeculatorConfig", speculator_class=qual))
        runner = model_runner()
        init_mod = importlib.import_module("vllm.v1.worker.gpu.spec_decode")
        instance = _call_with(init_mod.init_speculator, {"vllm_config": config, "device": device,
                                                         "req_states": ValueStub("RequestState")})
        instance.__class__ = stubs.absorbing(type(instance))
        file = inspect.getsourcefile(inspect.unwrap(type(instance).propose)) or "?"
    for loader in ("load_draft_model", "load_model"):
        if callable(getattr(type(instance), loader, None)):
            _call_with(getattr(instance, loader), {"target_model": ValueStub("target_model")})
            break
    # what the runner's initialize_kv_cache -> initialize_attn_backend sets (its KV-cache groups
    # are stubs here): the drafting layers' block size, the cache config's
    if getattr(instance, "block_size", None) == -1:
        instance.block_size = config.cache_config.block_size
    if getattr(instance, "draft_attn_groups", None) == []:
        instance.draft_attn_groups = [g for groups in runner.attn_groups for g in groups]
    return Drafter(instance, route.runner, file, route.method, route.spec.num_speculative_tokens)
