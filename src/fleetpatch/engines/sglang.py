"""The SGLang engine profile: files, code paths, routing and log signatures.

Everything here was read out of the released PyPI wheels
(`pip download --no-deps sglang==<v>`) for 0.5.7 through 0.5.15; the tests in
tests/fast/test_engine_profile.py check every string, file, class and line number
below against those wheels again.  Paths are relative to the directory that
holds the `sglang` package (site-packages).

How SGLang picks its speculative worker, by version range
---------------------------------------------------------
The scheduler asks `SpeculativeAlgorithm.create_worker(server_args)`
(sglang/srt/speculative/spec_info.py; a registry plus `scheduler.py` in 0.5.7)
for the worker class.  For the EAGLE family the choice is made only by
`server_args.disable_overlap_schedule` (+ `enable_multi_layer_eagle`), which
`ServerArgs._handle_speculative_decoding` sets at startup:

* 0.5.7           SGLANG_ENABLE_SPEC_V2 (default False) opts EAGLE/EAGLE3 into
                  spec v2; topk > 1 on v2 is a ValueError.  STANDALONE has no v2
                  worker (StandaloneWorker always).  Multi-layer EAGLE is chosen
                  in scheduler.py for any algorithm.
* 0.5.8 - 0.5.10  as 0.5.7, STANDALONE joins spec v2 (StandaloneWorkerV2).
* 0.5.11          SGLANG_ENABLE_SPEC_V2 defaults to True: spec v2 unless topk > 1
                  (silent fallback to v1), SGLANG_ENABLE_SPEC_V2 false, or
                  --disable-overlap-schedule.  DFLASH -> DFlashWorker.
* 0.5.12          as 0.5.11; --speculative-algorithm is free text (uppercased,
                  plugins); FROZEN_KV_MTP -> FrozenKVMTPWorker.
* 0.5.13          the v1 EAGLE/standalone/multi-layer workers are gone: always the
                  V2 class; SGLANG_ENABLE_SPEC_V2 false only selects non-overlap
                  (synchronous) scheduling.  The logic moved to
                  sglang/srt/arg_groups/speculative_hook.py.
* 0.5.14 - 0.5.15 SGLANG_ENABLE_SPEC_V2 is removed (a warning if set); DFLASH and
                  FROZEN_KV_MTP use V2 workers; NGRAMWorker is a BaseSpecWorker.

A version outside these ranges is *unknown*: `knows()` is False and nothing is
guessed (0.5.16+ must be checked against its wheel and added here).
"""
from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .base import EngineProfile, Evidence, Facts, LaunchConfig, Prediction, Resolution, Signature

SPEC = "sglang/srt/speculative/"
SERVER_ARGS = "sglang/srt/server_args.py"
ENVIRON = "sglang/srt/environ.py"
SPEC_INFO = SPEC + "spec_info.py"
SPEC_REGISTRY = SPEC + "spec_registry.py"
SPEC_HOOK = "sglang/srt/arg_groups/speculative_hook.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
ENGINE = "sglang/srt/entrypoints/engine.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"

# ----------------------------------------------------------------- code paths
# Code path name (the worker class) -> the file its class lives in.  The
# mapping never changed across 0.5.7 - 0.5.15; whether the file exists in a
# version is in VersionRange.files.
PATH_FILES: Dict[str, str] = {
    "EAGLEWorker": SPEC + "eagle_worker.py",
    "EAGLEWorkerV2": SPEC + "eagle_worker_v2.py",
    "MultiLayerEagleWorker": SPEC + "multi_layer_eagle_worker.py",
    "MultiLayerEagleWorkerV2": SPEC + "multi_layer_eagle_worker_v2.py",
    "StandaloneWorker": SPEC + "standalone_worker.py",
    "StandaloneWorkerV2": SPEC + "standalone_worker_v2.py",
    "NGRAMWorker": SPEC + "ngram_worker.py",
    "DFlashWorker": SPEC + "dflash_worker.py",                 # 0.5.11 - 0.5.13
    "DFlashWorkerV2": SPEC + "dflash_worker_v2.py",            # 0.5.14+
    "FrozenKVMTPWorker": SPEC + "frozen_kv_mtp_worker.py",     # 0.5.12 - 0.5.13
    "FrozenKVMTPWorkerV2": SPEC + "frozen_kv_mtp_worker_v2.py",  # 0.5.12+ (reached from 0.5.14)
}

# Files that serve the same role on the v1 and the v2 path.
SIBLING_PAIRS: List[Tuple[str, str]] = [
    (SPEC + "eagle_worker.py", SPEC + "eagle_worker_v2.py"),
    (SPEC + "multi_layer_eagle_worker.py", SPEC + "multi_layer_eagle_worker_v2.py"),
    (SPEC + "standalone_worker.py", SPEC + "standalone_worker_v2.py"),
]

# Families of algorithms; each maps to a (v1 worker, v2 worker) pair per range.
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")

ENV_SPEC_V2 = "SGLANG_ENABLE_SPEC_V2"
# sglang.srt.environ.EnvBool.parse (environ.py:116-121 in 0.5.7/0.5.8, 122-127 in
# 0.5.9-0.5.13): value.lower() in these lists, anything else (also "" and " true")
# warns "Invalid value for ..." and falls back to the default.
ENV_TRUE = ("true", "1", "yes", "y")
ENV_FALSE = ("false", "0", "no", "n")

READY_LINE = "The server is fired up and ready to roll!"
DUMP_PREFIX = "server_args=ServerArgs("
TRACEBACK = "Traceback (most recent call last):"


# ----------------------------------------------------------------- signatures
def _sig(key, text, source, lines, sets=(), means="", regex=None, probe=None) -> Signature:
    return Signature(key, text, source, tuple(sorted(lines.items(), key=lambda kv: Version(kv[0]))),
                     tuple(sets), means, regex, probe)


W1_TEXT = ("Overlap scheduler is disabled when spec v2 is off or using unsupported speculative algorithm. "
           "You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler.")
W2_TEXT = "Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is turned on."
W3_TEXT = ("The overlap scheduler and mixed chunked prefill are disabled because of "
           "using ngram speculative decoding.")

# 0.5.7 - 0.5.10: ServerArgs._handle_speculative_decoding (server_args.py)
W1_OPT_IN = _sig("W1", W1_TEXT, SERVER_ARGS,
                 {"0.5.7": 2018, "0.5.8": 2158, "0.5.9": 2386, "0.5.10": 3017},
                 [("overlap", False)], "spec v1: the overlap scheduler is disabled")
W2_OPT_IN = _sig("W2", W2_TEXT, SERVER_ARGS,
                 {"0.5.7": 2006, "0.5.8": 2146, "0.5.9": 2374, "0.5.10": 3005},
                 [("overlap", True)], "spec v2 with overlap scheduling")
W3_OLD = _sig("W3", W3_TEXT, SERVER_ARGS,
              {"0.5.7": 2110, "0.5.8": 2251, "0.5.9": 2481, "0.5.10": 3114, "0.5.11": 3598, "0.5.12": 3887},
              [("algorithm", "NGRAM"), ("overlap", False)], "NGRAM speculative decoding")
MULTI_LAYER_FORCED = _sig("MULTI_LAYER", "Spec v2 is enabled for multi-layer EAGLE speculative decoding.",
                          SERVER_ARGS, {"0.5.7": 1225, "0.5.8": 1332, "0.5.9": 1414, "0.5.10": 1803},
                          [("multi_layer", True)], "the model forces multi-layer EAGLE (and spec v2)")
ENV_INVALID = _sig("ENV_INVALID", "Invalid value for SGLANG_ENABLE_SPEC_V2:", ENVIRON,
                   {"0.5.7": 64, "0.5.8": 64, "0.5.9": 70, "0.5.10": 70, "0.5.11": 70, "0.5.12": 70,
                    "0.5.13": 70},
                   (), "SGLANG_ENABLE_SPEC_V2 is not a boolean: sglang used its default",
                   probe="Invalid value for ")

# 0.5.11 - 0.5.12: spec v2 by default (server_args.py)
W1_DEFAULT = _sig("W1", "Spec v1 is used for eagle/eagle3/standalone speculative decoding because ", SERVER_ARGS,
                  {"0.5.11": 3477, "0.5.12": 3765}, [("overlap", False)],
                  "spec v1: the overlap scheduler is disabled")
W2_DEFAULT = _sig("W2", "Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.",
                  SERVER_ARGS, {"0.5.11": 3482, "0.5.12": 3770}, [("overlap", True)],
                  "spec v2 with overlap scheduling")
DFLASH_V1 = _sig("DFLASH", "Overlap scheduler is disabled when using DFLASH speculative decoding "
                 "(spec v2 is not supported yet).", SERVER_ARGS, {"0.5.11": 3438, "0.5.12": 3707},
                 [("algorithm", "DFLASH"), ("overlap", False)], "DFLASH speculative decoding")
FROZEN_V1 = _sig("FROZEN_KV_MTP", "Overlap scheduler is disabled when using Frozen-KV MTP speculative decoding "
                 "(spec v2 is not supported yet).", SERVER_ARGS, {"0.5.12": 3725},
                 [("algorithm", "FROZEN_KV_MTP"), ("overlap", False)], "Frozen-KV MTP speculative decoding")

# 0.5.13: arg_groups/speculative_hook.py, V2 workers only
W1_SYNC_0513 = _sig("W1", "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone "
                    "speculative decoding.", SPEC_HOOK, {"0.5.13": 298}, [("overlap", False)],
                    "spec v2 without overlap scheduling (synchronous)")
W2_0513 = _sig("W2", "Overlap spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.",
               SPEC_HOOK, {"0.5.13": 303}, [("overlap", True)], "spec v2 with overlap scheduling")
W3_0513 = _sig("W3", W3_TEXT, SPEC_HOOK, {"0.5.13": 428}, [("algorithm", "NGRAM"), ("overlap", False)],
               "NGRAM speculative decoding")
DFLASH_0513 = _sig("DFLASH", DFLASH_V1.text, SPEC_HOOK, {"0.5.13": 242},
                   [("algorithm", "DFLASH"), ("overlap", False)], "DFLASH speculative decoding")
FROZEN_0513 = _sig("FROZEN_KV_MTP", FROZEN_V1.text, SPEC_HOOK, {"0.5.13": 261},
                   [("algorithm", "FROZEN_KV_MTP"), ("overlap", False)], "Frozen-KV MTP speculative decoding")

# 0.5.14 - 0.5.15: arg_groups/speculative_hook.py; no "overlap on" warning any more
W1_SYNC = _sig("W1", W1_SYNC_0513.text, SPEC_HOOK, {"0.5.14": 278, "0.5.15": 337}, [("overlap", False)],
               "spec v2 without overlap scheduling (synchronous)")
W3_NEW = _sig("W3", "The mixed chunked prefill are disabled because of using ngram speculative decoding.",
              SPEC_HOOK, {"0.5.14": 451, "0.5.15": 509}, [("algorithm", "NGRAM")], "NGRAM speculative decoding")
ENV_REMOVED = _sig("ENV_REMOVED", "SGLANG_ENABLE_SPEC_V2 has been removed: speculative decoding always runs "
                   "the V2 worker.", SPEC_HOOK, {"0.5.14": 71, "0.5.15": 77}, (),
                   "SGLANG_ENABLE_SPEC_V2 is set but ignored")

# The ServerArgs dump, INFO: logger.info(f"{server_args=}") in entrypoints/engine.py
# (_launch_subprocesses; the other hit is Engine.__init__).
DUMP = _sig("DUMP", DUMP_PREFIX, ENGINE,
            {"0.5.7": 918, "0.5.8": 960, "0.5.9": 1031, "0.5.10": 648, "0.5.11": 679, "0.5.12": 773,
             "0.5.13": 787, "0.5.14": 784, "0.5.15": 796},
            (), "the final ServerArgs", probe="server_args=")
READY = _sig("READY", READY_LINE, HTTP_SERVER,
             {"0.5.7": 1634, "0.5.8": 1665, "0.5.9": 1836, "0.5.10": 1929, "0.5.11": 2032, "0.5.12": 2033,
              "0.5.13": 2089, "0.5.14": 2145, "0.5.15": 2169}, (), "the server is ready")

# ----------------------------------------------------------------- failures
F_SCHEDULER = _sig("SCHEDULER_EXCEPTION", "Scheduler hit an exception:", SCHEDULER,
                   {"0.5.7": 2963, "0.5.8": 2995, "0.5.9": 3190, "0.5.10": 3620, "0.5.11": 3938,
                    "0.5.12": 4045, "0.5.13": 4066, "0.5.14": 4231, "0.5.15": 4333},
                   means="a scheduler process crashed", probe="Scheduler hit an exception: ")
F_DEAD = _sig("SCHEDULER_DEAD", "Rank N scheduler is dead.", ENGINE, {"0.5.7": 977, "0.5.8": 850, "0.5.9": 897},
              means="a scheduler process died during startup", regex=r"Rank \d+ scheduler is dead\.",
              probe=" scheduler is dead. Please check if there are relevant logs.")
F_DIED = _sig("SCHEDULER_DIED", "Rank N scheduler died during initialization", ENGINE,
              {"0.5.10": 1186, "0.5.11": 1220, "0.5.12": 1319, "0.5.13": 1339, "0.5.14": 1336, "0.5.15": 1361},
              means="a scheduler process died during startup", regex=r"Rank \d+ scheduler died during initialization",
              probe=" scheduler died during initialization ")
F_INIT = _sig("INIT_FAILED", "Initialization failed. Please see the error messages above.", ENGINE,
              {"0.5.7": 985, "0.5.8": 858, "0.5.9": 905, "0.5.10": 1212, "0.5.11": 1246, "0.5.12": 1345,
               "0.5.13": 1365, "0.5.14": 1362, "0.5.15": 1387}, means="startup failed")
F_SIGQUIT = _sig("SIGQUIT", "Received sigquit from a child process. It usually means the child failed.", ENGINE,
                 {"0.5.7": 806, "0.5.8": 823, "0.5.9": 870, "0.5.10": 1153, "0.5.11": 1187, "0.5.12": 1286,
                  "0.5.13": 1306, "0.5.14": 1303, "0.5.15": 1328}, means="a child process failed")
TOPK_V2_ERROR = "Spec v2 currently only supports topk = 1 for speculative decoding."
F_TOPK = _sig("TOPK_V2", TOPK_V2_ERROR, SERVER_ARGS,
              {"0.5.7": 2013, "0.5.8": 2153, "0.5.9": 2381, "0.5.10": 3012},
              means="spec v2 was asked for with --speculative-eagle-topk > 1")
PP_ERROR_OLD = ("Pipeline parallelism is not compatible with overlap schedule, speculative decoding, "
                "mixed chunked prefill.")
PP_ERROR_NEW = "Pipeline parallelism is not compatible with overlap schedule, speculative decoding"
F_PP_OLD = _sig("PP", PP_ERROR_OLD, SERVER_ARGS, {"0.5.7": 4545, "0.5.8": 4814, "0.5.9": 5141, "0.5.10": 6074},
                means="pipeline parallelism with speculative decoding")
F_PP_NEW = _sig("PP", PP_ERROR_NEW, SERVER_ARGS,
                {"0.5.11": 6789, "0.5.12": 7253, "0.5.13": 7426, "0.5.14": 6654, "0.5.15": 6575},
                means="pipeline parallelism with speculative decoding")
# Not SGLang's own strings: Python and argparse.
F_TRACEBACK = Signature("TRACEBACK", TRACEBACK, "<python>", (), means="a Python exception")
F_ARGPARSE = Signature("ARGPARSE", "error: argument / unrecognized arguments", "<argparse>", (),
                       means="the command line was rejected",
                       regex=r"\berror: (argument -|unrecognized arguments: |the following arguments are required)")

DFLASH_PP_ERROR = "Currently DFLASH speculative decoding only supports pp_size == 1."


# ----------------------------------------------------------------- ranges
@dataclass(frozen=True)
class VersionRange:
    name: str
    specifier: str                        # PEP 440
    verified: Tuple[str, ...]             # versions whose wheels this entry was checked against
    policy: str                           # "v2-opt-in" | "v2-default" | "v2-only-env" | "v2-only"
    env_default: Optional[bool]           # SGLANG_ENABLE_SPEC_V2 default; None: the variable is gone
    v2_algorithms: Tuple[str, ...]        # v2-opt-in: algorithms SGLANG_ENABLE_SPEC_V2 moves to v2
    algorithms: Tuple[str, ...]           # builtin algorithms (after NEXTN -> EAGLE)
    algorithm_choices: Optional[Tuple[str, ...]]  # argparse choices (exact case); None: free text, uppercased
    multi_layer_any_algorithm: bool       # 0.5.7: scheduler.py checks enable_multi_layer_eagle first
    workers: Tuple[Tuple[str, Tuple[Optional[str], Optional[str]]], ...]  # family -> (v1, v2)
    bases: Tuple[Tuple[str, str], ...]    # worker class -> worker class it inherits from
    files: Tuple[str, ...]                # what `fetch` copies (all exist in this range)
    signatures: Tuple[Signature, ...]     # path evidence in the log
    failures: Tuple[Signature, ...]
    pp_error: str

    def contains(self, version: str) -> bool:
        try:
            return SpecifierSet(self.specifier).contains(Version(version), prereleases=False)
        except InvalidVersion:
            return False

    @property
    def worker_map(self) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
        return dict(self.workers)

    @property
    def path_names(self) -> List[str]:
        return [n for n, f in PATH_FILES.items() if f in self.files]


@functools.lru_cache(maxsize=256)
def _range_of(version: str) -> Optional["VersionRange"]:
    # cached: planning and judging ask for a host's range again and again, and packaging
    # parses each range's specifier anew every time (12,000 lookups in a 32-host rollout)
    for rng in RANGES:
        if rng.contains(version):
            return rng
    return None


def _files(*paths: str, extra: Sequence[str] = ()) -> Tuple[str, ...]:
    base = [SERVER_ARGS, ENVIRON, SPEC_INFO, *extra]
    return tuple(base + [PATH_FILES[p] for p in paths])


_COMMON_FAILURES = (F_SCHEDULER, F_INIT, F_SIGQUIT, F_TRACEBACK, F_ARGPARSE)

R_0_5_7 = VersionRange(
    name="0.5.7", specifier=">=0.5.7,<0.5.8", verified=("0.5.7",), policy="v2-opt-in", env_default=False,
    v2_algorithms=("EAGLE", "EAGLE3"),
    algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM"),
    algorithm_choices=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
    multi_layer_any_algorithm=True,
    workers=(("eagle", ("EAGLEWorker", "EAGLEWorkerV2")),
             ("multi_layer_eagle", ("MultiLayerEagleWorker", "MultiLayerEagleWorkerV2")),
             ("standalone", ("StandaloneWorker", None)),
             ("ngram", ("NGRAMWorker", None))),
    bases=(("StandaloneWorker", "EAGLEWorker"),),
    files=_files("EAGLEWorker", "EAGLEWorkerV2", "MultiLayerEagleWorker", "MultiLayerEagleWorkerV2",
                 "StandaloneWorker", "NGRAMWorker"),   # (the multi-layer dispatch is in managers/scheduler.py)
    signatures=(W1_OPT_IN, W2_OPT_IN, W3_OLD, MULTI_LAYER_FORCED, ENV_INVALID),
    failures=_COMMON_FAILURES + (F_DEAD, F_TOPK, F_PP_OLD),
    pp_error=PP_ERROR_OLD,
)

R_0_5_8 = VersionRange(
    name="0.5.8-0.5.10", specifier=">=0.5.8,<0.5.11", verified=("0.5.8", "0.5.9", "0.5.10"), policy="v2-opt-in",
    env_default=False, v2_algorithms=("EAGLE", "EAGLE3", "STANDALONE"),
    algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM"),
    algorithm_choices=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
    multi_layer_any_algorithm=False,
    workers=(("eagle", ("EAGLEWorker", "EAGLEWorkerV2")),
             ("multi_layer_eagle", ("MultiLayerEagleWorker", "MultiLayerEagleWorkerV2")),
             ("standalone", ("StandaloneWorker", "StandaloneWorkerV2")),
             ("ngram", ("NGRAMWorker", None))),
    bases=(("StandaloneWorker", "EAGLEWorker"), ("StandaloneWorkerV2", "EAGLEWorkerV2")),
    files=_files("EAGLEWorker", "EAGLEWorkerV2", "MultiLayerEagleWorker", "MultiLayerEagleWorkerV2",
                 "StandaloneWorker", "StandaloneWorkerV2", "NGRAMWorker"),
    signatures=(W1_OPT_IN, W2_OPT_IN, W3_OLD, MULTI_LAYER_FORCED, ENV_INVALID),
    failures=_COMMON_FAILURES + (F_DEAD, F_DIED, F_TOPK, F_PP_OLD),   # F_DEAD to 0.5.9, F_DIED from 0.5.10
    pp_error=PP_ERROR_OLD,
)

R_0_5_11 = VersionRange(
    name="0.5.11", specifier=">=0.5.11,<0.5.12", verified=("0.5.11",), policy="v2-default", env_default=True,
    v2_algorithms=EAGLE_FAMILY,
    algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH"),
    algorithm_choices=("DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
    multi_layer_any_algorithm=False,
    workers=(("eagle", ("EAGLEWorker", "EAGLEWorkerV2")),
             ("multi_layer_eagle", ("MultiLayerEagleWorker", "MultiLayerEagleWorkerV2")),
             ("standalone", ("StandaloneWorker", "StandaloneWorkerV2")),
             ("ngram", ("NGRAMWorker", None)),
             ("dflash", ("DFlashWorker", None))),
    bases=(("StandaloneWorker", "EAGLEWorker"), ("StandaloneWorkerV2", "EAGLEWorkerV2")),
    files=_files("EAGLEWorker", "EAGLEWorkerV2", "MultiLayerEagleWorker", "MultiLayerEagleWorkerV2",
                 "StandaloneWorker", "StandaloneWorkerV2", "NGRAMWorker", "DFlashWorker"),
    signatures=(W1_DEFAULT, W2_DEFAULT, W3_OLD, DFLASH_V1, ENV_INVALID),
    failures=_COMMON_FAILURES + (F_DIED, F_PP_NEW),
    pp_error=PP_ERROR_NEW,
)

R_0_5_12 = VersionRange(
    name="0.5.12", specifier=">=0.5.12,<0.5.13", verified=("0.5.12",), policy="v2-default", env_default=True,
    v2_algorithms=EAGLE_FAMILY,
    algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "FROZEN_KV_MTP"),
    algorithm_choices=None,
    multi_layer_any_algorithm=False,
    workers=(("eagle", ("EAGLEWorker", "EAGLEWorkerV2")),
             ("multi_layer_eagle", ("MultiLayerEagleWorker", "MultiLayerEagleWorkerV2")),
             ("standalone", ("StandaloneWorker", "StandaloneWorkerV2")),
             ("ngram", ("NGRAMWorker", None)),
             ("dflash", ("DFlashWorker", None)),
             ("frozen_kv_mtp", ("FrozenKVMTPWorker", None))),   # FrozenKVMTPWorkerV2 exists, never created
    bases=(("StandaloneWorker", "EAGLEWorker"), ("StandaloneWorkerV2", "EAGLEWorkerV2"),
           ("FrozenKVMTPWorkerV2", "FrozenKVMTPWorker")),
    files=_files("EAGLEWorker", "EAGLEWorkerV2", "MultiLayerEagleWorker", "MultiLayerEagleWorkerV2",
                 "StandaloneWorker", "StandaloneWorkerV2", "NGRAMWorker", "DFlashWorker",
                 "FrozenKVMTPWorker", "FrozenKVMTPWorkerV2", extra=(SPEC_REGISTRY,)),
    signatures=(W1_DEFAULT, W2_DEFAULT, W3_OLD, DFLASH_V1, FROZEN_V1, ENV_INVALID),
    failures=_COMMON_FAILURES + (F_DIED, F_PP_NEW),
    pp_error=PP_ERROR_NEW,
)

R_0_5_13 = VersionRange(
    name="0.5.13", specifier=">=0.5.13,<0.5.14", verified=("0.5.13",), policy="v2-only-env", env_default=True,
    v2_algorithms=EAGLE_FAMILY,
    algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "FROZEN_KV_MTP"),
    algorithm_choices=None,
    multi_layer_any_algorithm=False,
    workers=(("eagle", (None, "EAGLEWorkerV2")),
             ("multi_layer_eagle", (None, "MultiLayerEagleWorkerV2")),
             ("standalone", (None, "StandaloneWorkerV2")),
             ("ngram", ("NGRAMWorker", None)),
             ("dflash", ("DFlashWorker", None)),
             ("frozen_kv_mtp", ("FrozenKVMTPWorker", None))),
    bases=(("StandaloneWorkerV2", "EAGLEWorkerV2"), ("FrozenKVMTPWorkerV2", "FrozenKVMTPWorker")),
    files=_files("EAGLEWorkerV2", "MultiLayerEagleWorkerV2", "StandaloneWorkerV2", "NGRAMWorker",
                 "DFlashWorker", "FrozenKVMTPWorker", "FrozenKVMTPWorkerV2",
                 extra=(SPEC_REGISTRY, SPEC_HOOK)),
    signatures=(W1_SYNC_0513, W2_0513, W3_0513, DFLASH_0513, FROZEN_0513, ENV_INVALID),
    failures=_COMMON_FAILURES + (F_DIED, F_PP_NEW),
    pp_error=PP_ERROR_NEW,
)

R_0_5_14 = VersionRange(
    name="0.5.14-0.5.15", specifier=">=0.5.14,<0.5.16", verified=("0.5.14", "0.5.15"), policy="v2-only",
    env_default=None, v2_algorithms=EAGLE_FAMILY,
    algorithms=("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "FROZEN_KV_MTP"),
    algorithm_choices=None,
    multi_layer_any_algorithm=False,
    workers=(("eagle", (None, "EAGLEWorkerV2")),
             ("multi_layer_eagle", (None, "MultiLayerEagleWorkerV2")),
             ("standalone", (None, "StandaloneWorkerV2")),
             ("ngram", (None, "NGRAMWorker")),
             ("dflash", (None, "DFlashWorkerV2")),
             ("frozen_kv_mtp", (None, "FrozenKVMTPWorkerV2"))),
    bases=(("StandaloneWorkerV2", "EAGLEWorkerV2"), ("FrozenKVMTPWorkerV2", "EAGLEWorkerV2")),
    files=_files("EAGLEWorkerV2", "MultiLayerEagleWorkerV2", "StandaloneWorkerV2", "NGRAMWorker",
                 "DFlashWorkerV2", "FrozenKVMTPWorkerV2", extra=(SPEC_REGISTRY, SPEC_HOOK)),
    signatures=(W1_SYNC, W3_NEW, ENV_REMOVED),
    failures=_COMMON_FAILURES + (F_DIED, F_PP_NEW),
    pp_error=PP_ERROR_NEW,
)

RANGES: Tuple[VersionRange, ...] = (R_0_5_7, R_0_5_8, R_0_5_11, R_0_5_12, R_0_5_13, R_0_5_14)


# ----------------------------------------------------------------- facts
_DUMP_FIELDS = {
    "speculative_algorithm": re.compile(r"(?<![A-Za-z0-9_])speculative_algorithm=(None|'([^']*)')"),
    "enable_multi_layer_eagle": re.compile(r"(?<![A-Za-z0-9_])enable_multi_layer_eagle=(True|False)"),
    "disable_overlap_schedule": re.compile(r"(?<![A-Za-z0-9_])disable_overlap_schedule=(True|False)"),
}


def parse_dump(line: str) -> Dict[str, object]:
    """The routing fields of a `server_args=ServerArgs(...)` line, by ServerArgs field name."""
    out: Dict[str, object] = {}
    start = line.find(DUMP_PREFIX)
    if start < 0:
        return out
    body = line[start:]
    for name, rx in _DUMP_FIELDS.items():
        m = rx.search(body)
        if not m:
            continue
        if name == "speculative_algorithm":
            out[name] = None if m.group(1) == "None" else m.group(2)
        else:
            out[name] = m.group(1) == "True"
    return out


def _fields_text(fields: Dict[str, object]) -> str:
    parts = []
    for name in ("speculative_algorithm", "enable_multi_layer_eagle", "disable_overlap_schedule"):
        if name in fields:
            v = fields[name]
            parts.append(f"{name}={v!r}" if isinstance(v, str) else f"{name}={v}")
    return ", ".join(parts)


def _norm_algorithm(name: Optional[str]) -> Optional[str]:
    if name is None:
        return None
    up = str(name).upper()
    return "EAGLE" if up == "NEXTN" else up


# ----------------------------------------------------------------- launch parsing
_VALUE_FLAGS = {
    "--speculative-algorithm": "algorithm",
    "--speculative-eagle-topk": "topk",
    "--pp-size": "pp",
    "--pipeline-parallel-size": "pp",
    "--config": "config",
}
_BOOL_FLAGS = {
    "--enable-multi-layer-eagle": "multi_layer",
    "--disable-overlap-schedule": "disable_overlap",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class LaunchArgs:
    algorithm: Optional[str] = None
    topk: Optional[int] = None
    pp: int = 1
    multi_layer: bool = False
    disable_overlap: bool = False
    config: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)   # from an `env A=B ...` prefix
    errors: List[str] = field(default_factory=list)     # what argparse would reject
    given: List[str] = field(default_factory=list)      # the flags seen, for messages


def parse_argv(argv: Sequence[str]) -> LaunchArgs:
    """The speculative-decoding flags of a server command line, as argparse reads them.

    argv[0] is the interpreter or script (may contain spaces); `-m module`,
    `env A=B cmd ...` and `sh -c "cmd ..."` are understood.  Flags are `--flag
    value` or `--flag=value`; the last occurrence wins.  (argparse's prefix
    abbreviations such as `--speculative-algo` are not recognised.)
    """
    args = [str(a) for a in argv]
    out = LaunchArgs()
    # env A=B python ...
    while args and os.path.basename(args[0]) == "env":
        i = 1
        while i < len(args) and (args[i] in ("-i", "-") or _ENV_NAME.match(args[i])):
            if "=" in args[i]:
                k, _, v = args[i].partition("=")
                out.env[k] = v
            i += 1
        args = args[i:]
    # sh -c "python -m sglang.launch_server ..."
    if args and os.path.basename(args[0]) in ("sh", "bash", "dash", "zsh") and "-c" in args[1:]:
        i = args.index("-c", 1)
        if i + 1 < len(args):
            try:
                inner = parse_argv(shlex.split(args[i + 1]))
            except ValueError:
                inner = None
            if inner is not None:
                inner.env = {**out.env, **inner.env}
                return inner
    i = 1
    while i < len(args):
        tok = args[i]
        if tok == "--":
            break
        name, eq, val = tok.partition("=")
        if name in _VALUE_FLAGS:
            key = _VALUE_FLAGS[name]
            if not eq:
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    val = args[i + 1]
                    i += 1
                else:
                    out.errors.append(f"argument {name}: expected one argument")
                    i += 1
                    continue
            out.given.append(f"{name} {val}")
            if key in ("topk", "pp"):
                try:
                    setattr(out, key, int(val))
                except ValueError:
                    out.errors.append(f"argument {name}: invalid int value: {val!r}")
            else:
                setattr(out, key, val)
        elif name in _BOOL_FLAGS and not eq:
            setattr(out, _BOOL_FLAGS[name], True)
            out.given.append(name)
        i += 1
    return out


def env_flag(raw: Optional[str], default: Optional[bool]) -> Tuple[Optional[bool], str, str]:
    """SGLANG_ENABLE_SPEC_V2 as sglang.srt.environ.EnvBool reads it.

    Returns (value, state, description); state is "unset" | "true" | "false" | "invalid".
    """
    if raw is None:
        return default, "unset", f"{ENV_SPEC_V2} is not set"
    low = raw.lower()
    if low in ENV_TRUE:
        return True, "true", f"{ENV_SPEC_V2}={raw}"
    if low in ENV_FALSE:
        return False, "false", f"{ENV_SPEC_V2}={raw}"
    return default, "invalid", (f"{ENV_SPEC_V2}={raw!r} is not a boolean (sglang reads it as its default, "
                                f"{default})")


# ----------------------------------------------------------------- the profile
class SGLangProfile(EngineProfile):
    kind = "sglang"
    package = "sglang"
    ready_line = READY_LINE
    # "[2026-01-05 10:11:12 DP0 TP0] ": logging's time, then the data/tensor parallel ranks
    log_prefix = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}[^\]]*\] ")
    # SGLANG_ENABLE_SPEC_V2 routes the worker; the rest of a server's environment may hold secrets
    launch_env_prefixes = ("SGLANG_",)
    # Facts.values: "algorithm" (str, or None = no speculative decoding), "multi_layer" (bool),
    # "overlap" (bool: overlap scheduling on, i.e. not disable_overlap_schedule)
    fact_keys = ("algorithm", "multi_layer", "overlap")
    path_noun, path_noun_short = "speculative decoding worker", "speculative worker"
    whole_evidence = (DUMP_PREFIX + "...",)   # log_facts' summary of the (very long) ServerArgs dump
    ranges = RANGES

    def __init__(self) -> None:
        self.sibling_pairs: List[Tuple[str, str]] = list(SIBLING_PAIRS)

    # ---------------------------------------------------------- versions
    def range_for(self, version: Optional[str]) -> Optional[VersionRange]:
        return _range_of(str(version)) if version else None

    def knows(self, version: str) -> bool:
        return self.range_for(version) is not None

    def known_versions(self) -> str:
        return "0.5.7 - 0.5.15"

    # ---------------------------------------------------------- files and paths
    def fetch_files(self, version: Optional[str]) -> List[str]:
        """Files `fetch` copies.  For a known version they all exist in it; for None
        or an unknown version, the union over every range (a host may lack some)."""
        rng = self.range_for(version)
        if rng is not None:
            return list(rng.files)
        out: List[str] = []
        for r in RANGES:
            for f in r.files:
                if f not in out:
                    out.append(f)
        return out

    def siblings(self, version: Optional[str]) -> List[Tuple[str, str]]:
        """The sibling pairs whose both files exist in `version` (all pairs if unknown)."""
        rng = self.range_for(version)
        if rng is None:
            return list(self.sibling_pairs)
        return [(a, b) for a, b in self.sibling_pairs if a in rng.files and b in rng.files]

    def siblings_for(self, specifier) -> List[Tuple[str, str]]:
        """The sibling pairs present in any known version a PEP 440 specifier
        admits; every pair when it admits none we know (never guess leniently)."""
        admitted = [v for rng in RANGES for v in rng.verified if specifier.contains(v, prereleases=True)]
        if not admitted:
            return list(self.sibling_pairs)
        out: List[Tuple[str, str]] = []
        for v in admitted:
            for pair in self.siblings(v):
                if pair not in out:
                    out.append(pair)
        return out

    @staticmethod
    def _norm_path(path: str) -> str:
        p = path.replace("\\", "/")
        for prefix in ("a/", "b/"):
            if p.startswith(prefix + "sglang/") or p.startswith(prefix + "python/sglang/"):
                p = p[len(prefix):]
        if p.startswith("python/sglang/"):
            p = p[len("python/"):]
        return p

    def paths_of_file(self, path: str) -> List[str]:
        p = self._norm_path(path)
        return [name for name, f in PATH_FILES.items() if f == p]

    def file_of_path(self, path_name: Optional[str], version: Optional[str] = None) -> Optional[str]:
        """The file of a code path; None when the path does not exist in `version`.
        For an unknown (or no) version the canonical file is returned."""
        if not path_name or path_name not in PATH_FILES:
            return None
        f = PATH_FILES[path_name]
        rng = self.range_for(version)
        if rng is None:
            return f
        return f if f in rng.files else None

    def ancestors(self, path_name: Optional[str], version: Optional[str]) -> List[str]:
        """Worker classes `path_name` inherits from (nearest first): code in their
        files runs on `path_name` too."""
        rng = self.range_for(version)
        if rng is None or not path_name:
            return []
        bases = dict(rng.bases)
        out, cur = [], path_name
        while cur in bases and bases[cur] not in out:
            cur = bases[cur]
            out.append(cur)
        return out

    def failure_signatures(self, version: Optional[str]) -> List[Signature]:
        rng = self.range_for(version)
        if rng is not None:
            return list(rng.failures)
        out: List[Signature] = []
        for r in RANGES:
            for s in r.failures:
                if s not in out:
                    out.append(s)
        return out

    def find_failures(self, version: Optional[str], lines: Sequence[str]) -> List[Tuple[int, Signature]]:
        sigs = self.failure_signatures(version)
        hits = []
        for i, line in enumerate(lines):
            for s in sigs:
                if s.matches(line):
                    hits.append((i, s))
                    break
        return hits

    # ---------------------------------------------------------- routing
    def family(self, rng: VersionRange, algorithm: Optional[str], multi_layer: Optional[bool]) -> Optional[str]:
        algo = _norm_algorithm(algorithm)
        if algo is None:
            return None
        if multi_layer and (rng.multi_layer_any_algorithm or algo in ("EAGLE", "EAGLE3")):
            return "multi_layer_eagle"
        return {"EAGLE": "eagle", "EAGLE3": "eagle", "STANDALONE": "standalone", "NGRAM": "ngram",
                "DFLASH": "dflash", "FROZEN_KV_MTP": "frozen_kv_mtp"}.get(algo)

    def resolve(self, version: Optional[str], values: Dict[str, object]) -> Resolution:
        """The worker class for a set of facts (see Facts.values)."""
        rng = self.range_for(version)
        if rng is None:
            return Resolution(None, False, f"sglang {version or '(version unknown)'} is not in fleetpatch's "
                                           f"engine profile (known: {self.known_versions()})")
        if "algorithm" not in values:
            return Resolution(None, False, "the speculative algorithm is not known")
        algo = _norm_algorithm(values["algorithm"])  # type: ignore[arg-type]
        if algo is None:
            return Resolution(None, True, "no speculative decoding")
        needs_ml = rng.multi_layer_any_algorithm or algo in ("EAGLE", "EAGLE3")
        if needs_ml and "multi_layer" not in values:
            return Resolution(None, False, "whether multi-layer EAGLE is on is not known")
        fam = self.family(rng, algo, bool(values.get("multi_layer")))
        workers = rng.worker_map.get(fam or "")
        if not workers:
            return Resolution(None, False, f"speculative algorithm {algo} is not a builtin of sglang {version}")
        v1, v2 = workers
        if v1 and v2:
            if "overlap" not in values:
                return Resolution(None, False, "whether the overlap scheduler is on is not known")
            return Resolution(v2 if values["overlap"] else v1, True)
        return Resolution(v1 or v2, True)

    def log_facts(self, version: Optional[str], lines: Sequence[str], first_line_no: int = 1) -> Facts:
        """Facts stated by the log window: the version's warnings, then the
        ServerArgs dump (the final values: it wins over the warnings)."""
        rng = self.range_for(version)
        sigs = rng.signatures if rng else ()
        warn = Facts("log")
        dump = Facts("log")
        for i, line in enumerate(lines):
            n = first_line_no + i
            if DUMP_PREFIX in line:
                fields = parse_dump(line)
                if fields:
                    ev = Evidence("log", n, f"{DUMP_PREFIX}... {_fields_text(fields)} ...)")
                    dump = Facts("log")  # the last dump in the window is the current boot
                    if "speculative_algorithm" in fields:
                        dump.values["algorithm"] = fields["speculative_algorithm"]
                        dump.evidence["algorithm"] = ev
                    if "enable_multi_layer_eagle" in fields:
                        dump.values["multi_layer"] = fields["enable_multi_layer_eagle"]
                        dump.evidence["multi_layer"] = ev
                    if "disable_overlap_schedule" in fields:
                        dump.values["overlap"] = not fields["disable_overlap_schedule"]
                        dump.evidence["overlap"] = ev
                continue
            for s in sigs:
                if s.matches(line):
                    ev = Evidence("log", n, self.strip_prefix(line))
                    warn.notes.append(ev)
                    for k, v in s.sets:
                        warn.values[k] = v
                        warn.evidence[k] = ev
        # The dump's values are final; the warnings stay as supporting lines (notes).
        return Facts("log", {**warn.values, **dump.values}, {**warn.evidence, **dump.evidence},
                     [ev for ev in warn.notes if ev not in dump.evidence.values()])

    def server_info_facts(self, version: Optional[str], info: Optional[dict]) -> Optional[Facts]:
        if not isinstance(info, dict):
            return None
        fields = {k: info[k] for k in ("speculative_algorithm", "enable_multi_layer_eagle",
                                       "disable_overlap_schedule") if k in info}
        if not fields:
            return None
        ev = Evidence("server_info", None, "/server_info " + _fields_text(fields))
        f = Facts("server_info")
        if "speculative_algorithm" in fields:
            f.values["algorithm"] = fields["speculative_algorithm"]
            f.evidence["algorithm"] = ev
        if "enable_multi_layer_eagle" in fields:
            f.values["multi_layer"] = bool(fields["enable_multi_layer_eagle"])
            f.evidence["multi_layer"] = ev
        if "disable_overlap_schedule" in fields:
            f.values["overlap"] = not bool(fields["disable_overlap_schedule"])
            f.evidence["overlap"] = ev
        return f

    def launch_facts(self, prediction: Optional[Prediction], launch: Optional[LaunchConfig]) -> Optional[Facts]:
        if prediction is None or not prediction.known_version or not prediction.starts:
            return None
        src = launch.source if launch is not None else "launch"
        ev = Evidence("launch", None, f"{src} launch configuration: {prediction.inputs or '(no speculative flags)'}")
        f = Facts("launch")
        f.values["algorithm"] = prediction.algorithm
        f.values["multi_layer"] = prediction.multi_layer
        f.evidence["algorithm"] = f.evidence["multi_layer"] = ev
        if prediction.overlap is not None:
            f.values["overlap"] = prediction.overlap
            f.evidence["overlap"] = ev
        return f

    def same_fact(self, key: str, a: object, b: object) -> bool:
        # "NEXTN" is an alias ServerArgs turns into "EAGLE"; the case of free text is not kept (0.5.12+)
        if isinstance(a, str) or isinstance(b, str):
            return _norm_algorithm(a) == _norm_algorithm(b)  # type: ignore[arg-type]
        return a == b

    def facts_text(self, values: Mapping[str, object]) -> str:
        """The facts under their ServerArgs names, as the dump and /server_info show them."""
        parts = []
        if "algorithm" in values:
            v = values["algorithm"]
            parts.append(f"speculative_algorithm={v!r}" if isinstance(v, str) else f"speculative_algorithm={v}")
        if "multi_layer" in values:
            parts.append(f"enable_multi_layer_eagle={values['multi_layer']}")
        if "overlap" in values:
            parts.append(f"disable_overlap_schedule={not values['overlap']}")
        return ", ".join(parts)

    # ---------------------------------------------------------- prediction
    def predict(self, version: str, launch: LaunchConfig) -> Prediction:
        """The worker a launch selects on `version`, as ServerArgs and create_worker decide it."""
        # A follow judges the same launch at every batch of lines, and a fleet's hosts
        # mostly share theirs: once per distinct launch (shlex was ~a tenth of the laptop's CPU).
        try:
            return _predicted(self, version, tuple(str(a) for a in launch.argv or ()),
                              tuple(sorted((launch.env or {}).items())))
        except TypeError:   # an environment value that cannot be a key: judged uncached
            return self._predict(version, launch)

    def _predict(self, version: str, launch: LaunchConfig) -> Prediction:
        args = parse_argv(launch.argv or [])
        q = _Launch(self, version, self.range_for(version), args, {**(launch.env or {}), **args.env}.get(ENV_SPEC_V2))
        refused = _before_routing(q)
        if refused is not None:
            return refused
        algo = _norm_algorithm(args.algorithm)
        routed = _route(q, algo)
        if isinstance(routed, Prediction):
            return routed
        overlap, cause = routed
        failed = _pp_failure(q, algo)
        if failed is not None:
            return failed
        res = self.resolve(version, {"algorithm": algo, "multi_layer": args.multi_layer, "overlap": overlap})
        return q.result(res.path if res.determined else None, True, cause + _multi_layer_note(q, algo),
                        algorithm=algo, overlap=overlap)


# ----------------------------------------------------------------- prediction, step by step
@dataclass
class _Launch:
    """One `predict` call: the launch as SGLang reads it, and how to answer it."""

    profile: SGLangProfile
    version: str
    rng: Optional[VersionRange]
    args: LaunchArgs
    raw_env: Optional[str]        # SGLANG_ENABLE_SPEC_V2 as set (None: not set)

    def __post_init__(self) -> None:
        self.inputs = _inputs(self.args, self.raw_env)
        self.notes = [f"--config {self.args.config} is not read: settings in that file are not part of "
                      "this prediction (the log decides)"] if self.args.config else []
        # SGLANG_ENABLE_SPEC_V2 as EnvBool reads it: (value, state, description)
        self.env_val, self.env_state, self.env_desc = env_flag(self.raw_env, self.rng.env_default if self.rng
                                                               else None)

    def result(self, path, starts, cause, error=None, algorithm=None, overlap=None) -> Prediction:
        rng = self.rng
        return Prediction(path=path, file=self.profile.file_of_path(path, self.version) if path else None,
                          starts=starts, cause=cause, error=error, known_version=rng is not None,
                          version=self.version or "", algorithm=algorithm, multi_layer=self.args.multi_layer,
                          overlap=overlap, range=rng.name if rng else None, inputs=self.inputs, notes=self.notes)

    def refuse(self, cause: str, error: str, algorithm=None, overlap=None) -> Prediction:
        """A launch that does not start."""
        return self.result(None, False, cause, error=error, algorithm=algorithm, overlap=overlap)

    @property
    def topk_over_1(self) -> bool:
        return self.args.topk is not None and self.args.topk > 1


def _inputs(args: LaunchArgs, raw_env: Optional[str]) -> str:
    flags = " ".join(args.given) if args.given else "no speculative flags"
    env = f"{ENV_SPEC_V2}={raw_env}" if raw_env is not None else f"{ENV_SPEC_V2} not set"
    return f"{flags}; {env}"


def _before_routing(q: _Launch) -> Optional[Prediction]:
    """The answer when the launch never reaches the worker choice: an unknown
    version, a command line argparse rejects, no or no builtin algorithm."""
    version, rng, raw_algo = q.version, q.rng, q.args.algorithm
    if rng is None:
        return q.result(None, True, f"sglang {version or '(version unknown)'} is not in fleetpatch's engine "
                                    f"profile (known: {q.profile.known_versions()}): the code path cannot be "
                                    "predicted, and is not guessed")
    if q.args.errors:
        return q.refuse(f"the command line is invalid ({q.args.errors[0]}): the server would not start",
                        q.args.errors[0])
    if raw_algo is None:
        return q.result(None, True, "--speculative-algorithm is not set: no speculative decoding worker runs")
    if rng.algorithm_choices is not None and raw_algo not in rng.algorithm_choices:
        return q.refuse(f"--speculative-algorithm {raw_algo} is not one of {', '.join(rng.algorithm_choices)} "
                        f"in sglang {version}: the server would not start",
                        f"argument --speculative-algorithm: invalid choice: {raw_algo!r}")
    algo = _norm_algorithm(raw_algo)
    if algo not in rng.algorithms:
        return q.result(None, True, f"--speculative-algorithm {raw_algo} is not a builtin algorithm of sglang "
                                    f"{version} (a plugin may register it): its worker cannot be predicted",
                        algorithm=algo)
    return None


Routed = Union[Prediction, Tuple[bool, str]]   # a launch that does not start, or (overlap, cause)


def _route(q: _Launch, algo: str) -> Routed:
    """Overlap scheduling on or off, and why: what picks v1 or v2 within a family."""
    if algo == "NGRAM":
        v2_only = q.rng.policy == "v2-only"
        return ((not q.args.disable_overlap) if v2_only else False,
                "--speculative-algorithm NGRAM runs NGRAMWorker"
                + ("" if v2_only else " (the overlap scheduler is disabled for ngram)"))
    if algo in ("DFLASH", "FROZEN_KV_MTP"):
        if q.rng.policy == "v2-only":
            return not q.args.disable_overlap, f"--speculative-algorithm {algo} runs its V2 worker in sglang {q.version}"
        return False, (f"--speculative-algorithm {algo} has no spec v2 in sglang {q.version}: "
                       "the overlap scheduler is disabled")
    return _POLICIES[q.rng.policy](q, algo)


def _v2_opt_in(q: _Launch, algo: str) -> Routed:
    """0.5.7 - 0.5.10: SGLANG_ENABLE_SPEC_V2 opts the EAGLE family into spec v2."""
    if algo in q.rng.v2_algorithms and q.env_val:
        if q.topk_over_1:
            return q.refuse(f"--speculative-eagle-topk {q.args.topk} cannot run on spec v2: the server would not "
                            "start", TOPK_V2_ERROR, algorithm=algo, overlap=True)
        cause = f"{q.env_desc}: spec v2 with overlap scheduling"
        return True, cause + (" (spec v2 overrides --disable-overlap-schedule)" if q.args.disable_overlap else "")
    if algo not in q.rng.v2_algorithms:
        return False, (f"sglang {q.version} has no spec v2 for {algo}: it runs the v1 worker"
                       + (f" even with {q.env_desc}" if q.env_val else f" ({q.env_desc})"))
    if q.topk_over_1:
        return False, f"{q.env_desc} (and --speculative-eagle-topk {q.args.topk} needs the v1 path)"
    return False, f"{q.env_desc}: spec v1, the overlap scheduler is disabled"


def _v2_default(q: _Launch, algo: str) -> Routed:
    """0.5.11 - 0.5.12: spec v2 unless topk > 1, the variable false or --disable-overlap-schedule."""
    if q.topk_over_1 and not q.args.disable_overlap:
        return False, (f"--speculative-eagle-topk {q.args.topk} makes sglang {q.version} fall back to spec v1 "
                       "(spec v2 only supports topk = 1)")
    if not q.env_val and not q.args.disable_overlap:
        return False, f"{q.env_desc} turns spec v2 off: spec v1, the overlap scheduler is disabled"
    if q.args.disable_overlap:
        return False, "--disable-overlap-schedule selects spec v1"
    if q.env_state == "unset":
        return True, f"spec v2 is the default in sglang {q.version} ({ENV_SPEC_V2} is not set): overlap scheduling"
    return True, f"{q.env_desc}: spec v2 with overlap scheduling"


def _v2_only_env(q: _Launch, algo: str) -> Routed:
    """0.5.13: V2 workers only; the variable false selects synchronous scheduling."""
    cause = f"sglang {q.version} has only the spec v2 workers"
    if not q.env_val:
        return False, cause + f"; {q.env_desc} selects non-overlap (synchronous) scheduling"
    if q.args.disable_overlap:
        return False, cause + "; --disable-overlap-schedule selects non-overlap (synchronous) scheduling"
    return True, cause + ", with overlap scheduling"


def _v2_only(q: _Launch, algo: str) -> Routed:
    """0.5.14+: V2 workers only; SGLANG_ENABLE_SPEC_V2 is gone."""
    cause = f"sglang {q.version} has only the spec v2 workers"
    if q.raw_env is not None:
        cause += f" ({ENV_SPEC_V2} is ignored: it was removed in 0.5.14)"
    return not q.args.disable_overlap, cause + (
        "; --disable-overlap-schedule selects non-overlap (synchronous) scheduling" if q.args.disable_overlap
        else ", with overlap scheduling")


_POLICIES = {"v2-opt-in": _v2_opt_in, "v2-default": _v2_default, "v2-only-env": _v2_only_env, "v2-only": _v2_only}


def _multi_layer_note(q: _Launch, algo: str) -> str:
    if q.args.multi_layer and (q.rng.multi_layer_any_algorithm or algo in ("EAGLE", "EAGLE3")):
        return "; --enable-multi-layer-eagle selects the multi-layer worker"
    return ""


def _pp_failure(q: _Launch, algo: str) -> Optional[Prediction]:
    """Pipeline parallelism: ServerArgs.check_server_args asserts; DFLASH refuses earlier (0.5.11+)."""
    if q.args.pp <= 1:
        return None
    return q.refuse(f"--pp-size {q.args.pp}: pipeline parallelism cannot be combined with speculative decoding: "
                    "the server would not start", DFLASH_PP_ERROR if algo == "DFLASH" else q.rng.pp_error,
                    algorithm=algo)


PROFILE = SGLangProfile()

__all__ = ["PROFILE", "SGLangProfile", "LaunchConfig", "Prediction", "Signature", "VersionRange", "Facts",
           "Resolution", "RANGES", "PATH_FILES", "SIBLING_PAIRS", "parse_argv", "parse_dump", "env_flag",
           "READY_LINE"]


@functools.lru_cache(maxsize=256)
def _predicted(profile: "SGLangProfile", version: Optional[str], argv: tuple, env: tuple) -> Prediction:
    """SGLangProfile.predict's memo; callers only read the Prediction it returns."""
    return profile._predict(version, LaunchConfig(argv=list(argv), env=dict(env)))
