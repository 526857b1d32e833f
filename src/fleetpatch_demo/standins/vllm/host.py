"""The host's vLLM install as the stand-in sees it: the site-packages directory that holds the
real ``vllm/`` files, the release (from ``vllm/_version.py``), the release's facts
(``release.json`` installed beside the stand-in) and the per-process set-up every vLLM process
does first (stubs, the concrete names, logging).
Stdlib only; Python 3.8+.
"""
import importlib
import json
import os
import re

from . import logs, stubs

HERE = os.path.dirname(os.path.abspath(__file__))


class Host(object):
    def __init__(self, site_dir=None):
        self.site_dir = site_dir or find_site_dir()
        self.version = read_version(self.site_dir)
        self.release = load_release(self.version)
        self.quoter = logs.Quoter(self.site_dir)

    @property
    def version_tuple(self):
        return tuple(int(p) for p in re.findall(r"\d+", self.version)[:3])

    @property
    def policy(self):
        return self.release["reviewed"]["policy"]

    def log_style(self):
        try:
            with open(os.path.join(self.site_dir, "vllm", "logger.py"), encoding="utf-8") as f:
                source = f.read()
        except OSError:
            source = ""
        return logs.prefix_style(self.version_tuple, source)

    def source(self, rel):
        try:
            with open(os.path.join(self.site_dir, rel), encoding="utf-8") as f:
                return f.read()
        except OSError:
            return ""

    def engine_core_name(self):
        """The EngineCore process's name (its log prefix), as the host's vllm/v1/engine/utils.py
        names the process: EngineCore_0 (0.10.0-0.10.1), EngineCore_DP0 (0.10.2), and "EngineCore"
        without data parallelism (later)."""
        m = re.search(r'name=f"(EngineCore_\w*)\{global_index\}"(?:\s+if\s+\w+\s+else\s+"(\w+)")?',
                      self.source("vllm/v1/engine/utils.py"))
        if m:
            return m.group(2) or m.group(1) + "0"
        return "EngineCore_DP0" if self.version_tuple < (0, 11) else "EngineCore"

    def api_server_name(self):
        """"APIServer", or None where the API server does not prefix its lines (0.10.0: its
        api_server.py has no decorate_logs("APIServer"))."""
        if self.log_style() == "format" or 'decorate_logs("APIServer")' in self.source(
                "vllm/entrypoints/openai/api_server.py"):
            return "APIServer"
        return None

    def worker_name(self, rank):
        """A TP worker's process name, as the host's multiproc_executor.py makes it:
        "VllmWorker rank=R" (0.10.0), "VllmWorker TP<r>" (0.10.1), "Worker_TP<r>" (0.10.2+)."""
        text = self.source("vllm/v1/executor/multiproc_executor.py")
        if 'process_name = "VllmWorker"' in text:
            return "VllmWorker TP%d" % rank
        if "VllmWorker rank=" in text:
            return "VllmWorker rank=%d" % rank
        return "Worker_TP%d" % rank


def find_site_dir():
    """The site-packages directory holding vllm/ (beside this package on a host)."""
    for d in [os.path.dirname(HERE)] + list(__import__("sys").path):
        if d and os.path.isfile(os.path.join(d, "vllm", "_version.py")):
            return d
    raise SystemExit("vllm_standin: no vllm/_version.py on sys.path: install the vLLM files first")


def read_version(site_dir):
    with open(os.path.join(site_dir, "vllm", "_version.py"), encoding="utf-8") as f:
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", f.read())
    if not m:
        raise SystemExit("vllm_standin: %s has no __version__" % os.path.join(site_dir, "vllm", "_version.py"))
    return m.group(1)


def load_release(version):
    """The facts of `version` (release.json beside the stand-in; a directory of them in a checkout)."""
    for path in (os.path.join(HERE, "release.json"),
                 os.path.join(HERE, "..", "..", "..", "fleetpatch", "engines", "vllm_releases", version + ".json")):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if doc.get("release") == version:
            return doc
    raise SystemExit("vllm_standin: no facts for vllm %s beside the stand-in (release.json)" % version)


def resolve_obj_by_qualname(qualname):
    """vllm.utils.import_utils.resolve_obj_by_qualname (0.34's init_speculator resolves the class)."""
    module, _, name = qualname.rpartition(".")
    return stubs.absorbing(getattr(importlib.import_module(module), name))


def set_up(host, process_name):
    """What each vLLM process does first: stubs for what the host lacks, the names whose value
    matters, vLLM's logging.  Returns (envs module, Log)."""
    rules = stubs.rules(host.site_dir)
    by_module = rules.module_attrs
    by_module["vllm.logger"] = {"init_logger": logs.init_logger, "logger": logs.init_logger("vllm")}
    for mod in ("vllm.utils.import_utils", "vllm.utils"):
        by_module[mod] = {"resolve_obj_by_qualname": resolve_obj_by_qualname}
    from .drafter import CONFIG_ENUMS, ModelLayers
    layers = ModelLayers()
    for mod in ("vllm.config", "vllm.config.compilation", "vllm.config.utils", "vllm.config.vllm"):
        by_module[mod] = dict(CONFIG_ENUMS, get_layers_from_vllm_config=layers)
    # the data-parallel coordination of a single engine: no micro-batching (DBO off)
    rules.concrete_names["coordinate_batch_across_dp"] = \
        lambda *a, **k: stubs.LeadingNone("coordinate_batch_across_dp()")
    by_module["vllm.version"] = {"__version__": host.version}
    by_module["vllm"] = {"__version__": host.version}
    stubs.install(rules)
    envs = importlib.import_module("vllm.envs")
    log = logs.Log(host.quoter, host.log_style(), process_name)
    return envs, log
