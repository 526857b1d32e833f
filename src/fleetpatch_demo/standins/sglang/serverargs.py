"""The launch flags: parsed with the tree's real parser into the tree's ServerArgs, routed
by the tree's own __post_init__ handlers (or, 0.5.13+, this module's replica of
arg_groups/speculative_hook.py), checked, and logged as engine.py dumps them; SGLang's
logging format and its per-rank prefixes."""
import argparse
import dataclasses
import importlib
import logging
import os

from .envs import Envs
from .release import version_tuple
from .srtutils import get_device_memory_capacity


def record_fields(record):
    """The field names of a ServerArgs: a dataclass through 0.5.19, a Struct after."""
    names = getattr(record, "__struct_fields__", None)
    if names is not None:
        return tuple(names)
    return tuple(f.name for f in dataclasses.fields(record))


def configure_logging(server_args, prefix=""):
    """Like sglang.srt.utils.common.configure_logger."""
    level = getattr(logging, str(getattr(server_args, "log_level", "info") or "info").upper(), logging.INFO)
    logging.basicConfig(level=level, format="[%(asctime)s" + prefix + "] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)


def rank_prefix(server_args, tp_rank, dp_rank):
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


def _handle_speculative_decoding_v2_only(server_args):
    """SGLang 0.5.13+ moved the speculative handling out of server_args.py into
    sglang/srt/arg_groups/speculative_hook.py, which is not part of the host
    tree; this replicates its EAGLE/STANDALONE/NGRAM part. Only V2 workers
    exist. 0.5.13: SGLANG_ENABLE_SPEC_V2 unset/false selects the non-overlap
    (synchronous) V2 path; 0.5.14+: the variable is retired (a notice is
    logged) and the overlap scheduler stays as the user chose."""
    log = logging.getLogger("sglang.srt.arg_groups.speculative_hook")
    env_v2_era = version_tuple() < (0, 5, 14)
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
        if env_v2_era and not Envs().SGLANG_ENABLE_SPEC_V2.get() and not server_args.disable_overlap_schedule:
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


# engine.py's redact_watermark_secrets (sampling/watermarking/core.py, 0.5.22+):
# in the dict it dumps, these keys read "<redacted>" whatever their value.
WATERMARK_SECRET_FIELD_NAMES = ("watermark_key", "watermark_key_b", "watermark_config")


def server_args_line(server_args):
    """engine.py's dump: `server_args=ServerArgs(...)` (the dataclass repr) through
    0.5.18, `server_args={...}` (resolved_dict(), field by field) from 0.5.19
    (fields of the msgspec Struct from 0.5.20), its watermark secrets redacted
    from 0.5.22."""
    if version_tuple() < (0, 5, 19):
        return "server_args=%r" % (server_args,)
    fields = dict((name, getattr(server_args, name, None)) for name in record_fields(server_args))
    if version_tuple() >= (0, 5, 22):
        for name in WATERMARK_SECRET_FIELD_NAMES:
            if name in fields:
                fields[name] = "<redacted>"
    return "server_args=%r" % (fields,)
