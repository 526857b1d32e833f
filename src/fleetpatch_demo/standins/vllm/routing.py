"""Which engine, model runner and drafter a `vllm serve` launch runs, as the installed release
decides it.

Inputs: the parsed flags, the environment read through the host's REAL ``vllm/envs.py`` (so
``VLLM_USE_V1`` / ``VLLM_USE_V2_MODEL_RUNNER`` parse exactly as that release parses them), the
release's facts (``release.json`` beside this module: generated from the same wheel by fleetpatch's
``engine-facts``; its policy names the release's rule), and the model's ``config.json``
(``architectures``) for the releases that pick V2 by architecture.

* v0-v1 (0.10.x): V1 unless VLLM_USE_V1=0; a V0-only flag (the ``_raise_or_fallback`` calls of the
  host's engine/arg_utils.py, read from its source) falls back to V0 with its warning when
  VLLM_USE_V1 is unset and is an error with VLLM_USE_V1=1; speculative decoding on V0 is
  platforms/cuda.py's NotImplementedError.
* v2-opt-in (about 0.12 - 0.21): V2 only with VLLM_USE_V2_MODEL_RUNNER=1; a draft method V2 has
  no speculator for is the release's ValueError.
* v2-by-architecture (0.22 - 0.28): unset -> V2 for the architectures on the release's list
  (config/vllm.py), V1 for the others, without a log line.
* v2-default (0.29 - 0.33): unset -> V2; `--enable-lora` is the modelled unsupported feature
  ("Model Runner V2 does not yet support %s; using the V1 model runner instead.").
* v2-only (0.34+): V2; VLLM_USE_V2_MODEL_RUNNER other than 1 is the release's error.

The drafter class: V1 by the facts' ``drafter_branches`` (the conditions of gpu_model_runner.py,
evaluated against the launch's speculative config); V2 by the host's REAL ``init_speculator``
(drafter.py runs it).
Stdlib only; Python 3.8+.
"""
import json
import logging
import os

from . import logs, stubs

INFO, WARNING = logging.INFO, logging.WARNING


class StartupError(Exception):
    """The server refuses to start: (exception type name, message, source, line)."""

    def __init__(self, kind, message, source=None, line=None):
        Exception.__init__(self, message)
        self.kind, self.message, self.source, self.line = kind, message, source, line


def parse_argv(argv):
    """`serve MODEL --flag v ...` / `--model M ...`: (model, {flag: value}, [bare flags]).
    `--a_b` and `--a-b` are one flag, as in vLLM's parser."""
    values, bare, positional = {}, [], []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            name, eq, val = tok[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                values[name] = val
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                values[name] = argv[i + 1]
                i += 1
            else:
                bare.append(name)
        else:
            positional.append(tok)
        i += 1
    model = positional[0] if positional else values.get("model", "facebook/opt-125m")
    return model, values, bare


class SpecConfig(object):
    """The parts of vLLM's SpeculativeConfig the routing and the drafters read; the `use_*` /
    `uses_*` predicates answer from the release's method lists (facts `method_tests`)."""

    def __init__(self, doc, method_tests, draft_architectures):
        for k, v in doc.items():          # every field the launch gave, as given
            if isinstance(k, str) and k.isidentifier():
                self.__dict__[k] = v
        if self.method_is("ngram", "ngram_gpu"):
            # SpeculativeConfig.__post_init__: both lookup bounds default to 5 when neither is given
            high = doc.get("prompt_lookup_max") or doc.get("prompt_lookup_min") or 5
            self.prompt_lookup_max = high
            self.prompt_lookup_min = doc.get("prompt_lookup_min") or high
        self.doc = doc
        self.method = doc.get("method")
        self.num_speculative_tokens = int(doc.get("num_speculative_tokens", 3))
        self.model = doc.get("model")
        self.method_tests = method_tests
        self.draft_architectures = draft_architectures
        # vLLM's default tree for a chain of N drafts: [(0,), (0, 0), ...]
        self.speculative_token_tree = str([(0,) * (i + 1) for i in range(self.num_speculative_tokens)])

    def method_is(self, *names):
        return self.doc_method in names

    @property
    def doc_method(self):
        return self.__dict__.get("method")

    def test(self, name):
        return self.method in self.method_tests.get(name, ())

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr.startswith(("use_", "uses_")):
            return Predicate(self.test(attr))
        # an optional feature the launch did not turn on (parallel_drafting, ...): off
        return stubs.Off("speculative_config." + attr)


class Predicate(object):
    """A SpeculativeConfig predicate that vLLM reads as a method (`use_eagle()`) or as a
    property (`use_heterogeneous_vocab`): both answer the same."""

    def __init__(self, value):
        self.value = bool(value)

    def __call__(self, *args, **kwargs):
        return self.value

    def __bool__(self):
        return self.value


def read_config(model):
    """MODEL/config.json (a local model directory) as a dict, or {}."""
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_architectures(model):
    """`architectures` of MODEL/config.json, or []."""
    archs = read_config(model).get("architectures")
    return list(archs) if isinstance(archs, list) else []


class Route(object):
    """What runs: engine "v0"/"v1", runner "v1"/"v2"/None, the drafter class and file, and the
    lines that show the choice: [(process, level, source, needle, args)]."""

    def __init__(self):
        self.engine, self.runner, self.method = "v1", None, None
        self.drafter, self.drafter_file = None, None
        self.lines = []
        self.spec = None
        self.architectures, self.hf_doc = [], {}

    def line(self, process, level, source, needle, *args):
        self.lines.append((process, level, source, needle, args))


def _fallback_flags(quoter):
    """[(flag, recommend_to_remove)] of engine/arg_utils.py's `_raise_or_fallback(feature_name="--x")`."""
    import ast
    tree = quoter.tree("vllm/engine/arg_utils.py")
    out = []
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_raise_or_fallback":
            kw = {k.arg: k.value for k in node.keywords}
            name = kw.get("feature_name")
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("--"):
                rec = kw.get("recommend_to_remove")
                out.append((node.lineno, name.value, bool(getattr(rec, "value", False))))
    return [(f, r) for _, f, r in sorted(out)]


def choose(release, envs, quoter, model, values, bare):
    """The Route of this launch, or StartupError."""
    x, policy = release["extracted"], release["reviewed"]["policy"]
    route = Route()
    spec_doc = None
    if "speculative-config" in values:
        try:
            spec_doc = json.loads(values["speculative-config"])
        except ValueError as e:
            raise StartupError("ValueError", "--speculative-config: %s" % e)
    if spec_doc is not None:
        draft = spec_doc.get("model")
        route.spec = SpecConfig(spec_doc, x.get("method_tests", {}), read_architectures(draft) if draft else [])
        route.method = route.spec.method
    if policy == "v0-v1":
        _engine_v0_v1(route, envs, quoter, bare, values)
        if route.engine == "v0":
            return route
        route.runner = "v1" if route.spec else None
    elif policy in ("v1-only",):
        route.runner = "v1"
    else:
        route.runner = _runner(route, release, envs, quoter, model, values, bare)
    if route.spec is None:
        route.runner = route.runner if policy != "v0-v1" else None
        return route
    if route.runner == "v1":
        route.drafter = pick_v1_drafter(x["drafter_branches"], route.spec)
        route.drafter_file = x["drafters"].get(route.drafter)
        if route.drafter is None:
            raise StartupError("ValueError", "Unsupported speculative method: '%s'" % route.method)
    return route


def _engine_v0_v1(route, envs, quoter, bare, values):
    use_v1 = envs.VLLM_USE_V1
    explicit = envs.is_set("VLLM_USE_V1")
    if not explicit or use_v1:
        given = set(bare) | set(values)
        for flag, recommend in _fallback_flags(quoter):
            if flag[2:] not in given:
                continue
            if explicit:
                raise StartupError("NotImplementedError", "VLLM_USE_V1=1 is not supported with %s." % flag,
                                   "vllm/engine/arg_utils.py")
            # _raise_or_fallback's message, its pieces read from the host's function
            src = "vllm/engine/arg_utils.py"
            msg = quoter.quote(src, "is not supported by the V1 Engine")[0].replace("%s", flag)
            msg += quoter.quote(src, "Falling back to V0. ")[0]
            if recommend:
                msg += quoter.quote(src, "We recommend to remove")[0].replace("%s", flag)
                msg += quoter.quote(src, "in favor of the V1 Engine")[0]
            route.lines.append(("api", WARNING, src, None,
                                (msg, logs.call_line(quoter, src, "_raise_or_fallback", "warning") or 0)))
            use_v1 = False
            break
    if use_v1:
        route.engine = "v1"
        return
    route.engine = "v0"
    if route.spec is not None:
        hit = quoter.quote("vllm/platforms/cuda.py", "Speculative decoding is not supported on vLLM V0")
        raise StartupError("NotImplementedError", hit[0] if hit else "Speculative decoding is not supported on vLLM V0.",
                           "vllm/platforms/cuda.py", hit[1] if hit else None)


def _runner(route, release, envs, quoter, model, values, bare):
    x, policy = release["extracted"], release["reviewed"]["policy"]
    raw = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if policy == "v2-only":
        if raw is not None and raw != "1":
            hit = quoter.quote("vllm/platforms/interface.py", "is no longer supported: Model Runner V1")
            text = hit[0] if hit else "Model Runner V1 has been removed"
            raise StartupError("ValueError", text.replace("%s", raw) if "%s" in text else text,
                               "vllm/platforms/interface.py", hit[1] if hit else None)
        if raw == "1":
            route_line(route, quoter, "api", WARNING, "vllm/platforms/interface.py", "is redundant and can be unset")
        return "v2"
    try:
        use_v2 = envs.VLLM_USE_V2_MODEL_RUNNER      # the release's own parsing
    except ValueError as e:
        raise StartupError("ValueError", str(e), "vllm/envs.py")
    source = x["v2_decided_in"].get("source") if x.get("v2_decided_in") else None
    if policy == "v2-opt-in":
        runner = "v2" if use_v2 else "v1"
        if runner == "v2" and route.spec is not None and not route.spec.test("use_eagle"):
            hit = quoter.quote("vllm/config/vllm.py", "does not yet support")
            what = quoter.quote("vllm/config/vllm.py", "speculative method '")
            raise StartupError("ValueError", (hit[0] if hit else "VLLM_USE_V2_MODEL_RUNNER does not yet support: ")
                               + (what[0] if what else "speculative method '%s'").replace("%s", str(route.method)),
                               "vllm/config/vllm.py", hit[1] if hit else None)
        return runner
    if use_v2 is not None:
        return "v2" if use_v2 else "v1"
    if policy == "v2-by-architecture":
        archs = read_architectures(model)
        listed = set()
        for entry in x.get("architecture_lists", []):
            listed.update(entry["architectures"])
        return "v2" if set(archs) & listed else "v1"
    # v2-default: the modelled unsupported feature warns and falls back
    if "enable-lora" in bare:
        if route_line(route, quoter, "api", WARNING, source or "vllm/config/vllm.py",
                      "does not yet support %s; using the V1 model runner", "LoRA"):
            return "v1"
    return "v2"


def route_line(route, quoter, process, level, source, needle, *args):
    hit = quoter.quote(source, needle)
    if hit is None:
        return False
    route.line(process, level, source, needle, *args)
    return True


def pick_v1_drafter(branches, spec):
    """The class of the first of gpu_model_runner.py's branches whose conditions hold."""

    class _Self(object):
        speculative_config = spec

    class _PP(object):
        is_last_rank = True

    scope = {"self": _Self(), "get_pp_group": lambda: _PP(), "speculative_config": spec,
             "method": spec.method, "envs": None}
    for b in branches:
        try:
            if all(eval(cond, {"__builtins__": {"any": any, "all": all}}, scope) for cond in b["when"]):
                return b["class"]
        except Exception:
            continue
    return None
