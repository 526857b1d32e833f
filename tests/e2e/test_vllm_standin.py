"""The vLLM stand-in on host trees of four real vLLM releases (0.10.2: V0 and V1 engines;
0.20.2: Model Runner V2 opt-in; 0.33.0: V2 by default, V1 still shipped; 0.34.0: V2 only).

Each host tree is a temporary site-packages with the release's real files from its PyPI wheel
and the stand-in (`install.install_standin`); the server is started as an operator starts vLLM
(`python -m vllm_standin serve MODEL ...`) with only that directory on its path.  A line added
to a drafter file writes the pid of the process that ran it, so the tests see which file's
propose step runs, in which process, at start-up or per request.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fleetpatch.engines import vllm as vllm_profile
from fleetpatch.engines.base import LaunchConfig
from fleetpatch.probe import install as probe_install
from fleetpatch.probe.verdict import parse_records
from fleetpatch_demo.standins.vllm import install
from support.ports import free_port

pytestmark = pytest.mark.pypi

RELEASES = ("0.10.2", "0.20.2", "0.33.0", "0.34.0")
EAGLE = json.dumps({"method": "eagle", "num_speculative_tokens": 3})
# where each runner's propose step is defined, per release (the class's own file or its base's)
V1_PROPOSE = {"0.10.2": "vllm/v1/spec_decode/eagle.py", "0.20.2": "vllm/v1/spec_decode/llm_base_proposer.py",
              "0.33.0": "vllm/v1/spec_decode/llm_base_proposer.py"}
V2_PROPOSE = {"0.20.2": "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py",
              "0.33.0": "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
              "0.34.0": "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py"}
MARK = 'open(__import__("os").environ["STANDIN_MARK"], "a").write("%s %d\\n" % ({tag!r}, __import__("os").getpid()))'


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One site-packages per release with its real vLLM files (fetched once per machine)."""
    out = {}
    for r in RELEASES:
        site = tmp_path_factory.mktemp(f"site-{r}")
        try:
            install.install_vllm_files(site, r)
        except OSError as e:      # offline and not cached: skipped, never faked
            pytest.skip(f"vllm {r} wheel members not available: {e}")
        install.install_standin(site)
        out[r] = site
    return out


def facts(release):
    return json.loads((vllm_profile.FACTS_DIR / f"{release}.json").read_text())


def wheel_text(site, source):
    return (Path(site) / source).read_text(encoding="utf-8")


def add_mark(site, source, func, tag):
    """Add, as the first statement of every `func` in `source`, a line that logs (tag, pid)."""
    path = Path(site) / source
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    firsts = sorted((n.body[0].lineno, n.body[0].col_offset) for n in ast.walk(ast.parse(text))
                    if isinstance(n, ast.FunctionDef) and n.name == func)
    assert firsts, f"{source} has no {func}"
    for lineno, col in reversed(firsts):
        lines.insert(lineno - 1, " " * col + MARK.format(tag=tag) + "\n")
    path.write_text("".join(lines), encoding="utf-8")


class Server:
    """A stand-in started as an operator starts vLLM, its output redirected to a log file."""

    def __init__(self, site, home, args, env=None, module=("vllm_standin", "serve")):
        self.site, self.port = site, free_port()
        self.log_path = Path(home) / f"server-{self.port}.log"
        self.mark = Path(home) / "mark.txt"
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(site),
                    "STANDIN_MARK": str(self.mark), **(env or {})}
        cmd = [sys.executable, "-m", *module, *args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.argv = cmd[1:]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=home, env=full_env, stdout=out, stderr=subprocess.STDOUT)
        self.ready = self.wait_ready()

    def wait_ready(self, deadline_s=120):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)   # a refused connection costs nothing: each start is seen within 50 ms
        return False

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return json.loads(r.read())

    def complete(self, max_tokens=2):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                     data=json.dumps({"prompt": "x", "max_tokens": max_tokens}).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def marks(self):
        if not self.mark.exists():
            return []
        return [tuple(line.split()) for line in self.mark.read_text().splitlines()]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    @property
    def log(self):
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def pid_of(self, process_name):
        """The pid in the `(NAME pid=N)` prefix of the log's lines."""
        import re
        pids = set(re.findall(r"\(%s pid=(\d+)\)" % re.escape(process_name), self.log))
        assert len(pids) == 1, f"{process_name}: {pids}\n{self.log}"
        return pids.pop()


@pytest.fixture
def host(pristine, tmp_path):
    """A fresh copy of a release's site-packages (a test may patch it) and a HOME for the server."""
    def make(release):
        site = tmp_path / f"site-{release}"
        shutil.copytree(pristine[release], site)
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        return site, home

    return make


@pytest.fixture
def serve(tmp_path):
    servers = []

    def start(site, home, args, env=None, **kw):
        s = Server(site, home, args, env, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def model_dir(home, architectures=("LlamaForCausalLM",)):
    d = Path(home) / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": list(architectures)}))
    return str(d)


def both_paths_marked(site, release):
    if release in V1_PROPOSE:
        add_mark(site, V1_PROPOSE[release], "propose", "v1")
    if release in V2_PROPOSE:
        add_mark(site, V2_PROPOSE[release], "propose", "v2")


def ran_at(server, tag):
    return [pid for t, pid in server.marks() if t == tag]


# --------------------------------------------------------------------------- the paths

CASES = [
    # release, env, expected runner, "Using V2 Model Runner" expected
    ("0.10.2", {}, "v1", False),
    ("0.20.2", {}, "v1", False),
    ("0.20.2", {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "v2", True),
    ("0.33.0", {}, "v2", True),
    ("0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v1", False),
    ("0.34.0", {}, "v2", False),
]


@pytest.mark.parametrize("release,env,runner,v2_line", CASES,
                         ids=[f"{c[0]}-{c[2]}-{'-'.join(c[1].values()) or 'default'}" for c in CASES])
def test_each_release_runs_the_runner_it_picks_and_only_that_drafter(host, serve, release, env, runner, v2_line):
    site, home = host(release)
    both_paths_marked(site, release)
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE, "--enforce-eager"], env)
    assert s.ready, s.log
    assert s.marks() == []                      # --enforce-eager: nothing traced at start-up
    assert s.complete(max_tokens=2)["choices"][0]["text"]
    ran = s.marks()
    assert ran and {t for t, _ in ran} == {runner}, (ran, s.log)
    # the propose step ran in the EngineCore process (TP 1: the worker lives there), not the API server
    core = s.pid_of("EngineCore_DP0" if release == "0.10.2" else "EngineCore")
    assert {pid for _, pid in ran} == {core}
    assert s.pid_of("APIServer") == str(s.proc.pid) and core != str(s.proc.pid)
    text = wheel_text(site, "vllm/v1/worker/gpu_worker.py") if release != "0.34.0" else ""
    assert ("Using V2 Model Runner" in s.log) == v2_line
    if v2_line:
        assert '"Using V2 Model Runner"' in text     # the literal is the host's own
    assert "Initializing a V1 LLM engine (v%s) with config: " % release in s.log
    assert facts(release)["extracted"]["choice_lines"] and s.log.count("Application startup complete.") == 1
    assert s.get("/version") == {"version": release}
    assert s.get("/v1/models")["data"][0]["id"].endswith("model")
    assert s.stop() == 0
    assert "Application shutdown complete." in s.log


def test_profile_predicts_the_path_from_the_standins_own_argv(host, serve):
    """fleetpatch reads the stand-in's argv and environ exactly as a `vllm serve` launch."""
    site, home = host("0.33.0")
    both_paths_marked(site, "0.33.0")
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE, "--enforce-eager"],
              {"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert s.ready, s.log
    s.complete()
    pred = vllm_profile.PROFILE.predict("0.33.0", LaunchConfig(argv=s.argv, env={"VLLM_USE_V2_MODEL_RUNNER": "0"}))
    assert pred.path == "EagleProposer" and {t for t, _ in s.marks()} == {"v1"}
    as_vllm = ["serve", *s.argv[3:]]
    assert vllm_profile.parse_serve(s.argv) == vllm_profile.parse_serve(as_vllm)


# --------------------------------------------------------------------------- processes

@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_tensor_parallel_workers_are_processes_of_their_own(host, serve, method):
    site, home = host("0.34.0")
    both_paths_marked(site, "0.34.0")
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE, "--enforce-eager",
                           "--tensor-parallel-size", "2"], {"VLLM_WORKER_MULTIPROC_METHOD": method})
    assert s.ready, s.log
    s.complete(max_tokens=1)
    workers = {s.pid_of("Worker_TP0"), s.pid_of("Worker_TP1")}
    core, api = s.pid_of("EngineCore"), s.pid_of("APIServer")
    assert len(workers) == 2 and core not in workers and api not in workers and core != api
    assert {pid for _, pid in s.marks()} == workers        # each rank ran the speculator's propose
    ppids = {w: Path(f"/proc/{w}/stat").read_text().split(")")[1].split()[1] for w in workers}
    assert set(ppids.values()) == {core}                  # started by the EngineCore, as vLLM does
    assert s.stop() == 0
    assert all(not Path(f"/proc/{w}").exists() or "zombie" in Path(f"/proc/{w}/status").read_text()
               for w in workers)


def test_without_v1_multiprocessing_the_engine_runs_in_the_api_server(host, serve):
    site, home = host("0.33.0")
    both_paths_marked(site, "0.33.0")
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE, "--enforce-eager"],
              {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert s.ready, s.log
    s.complete(max_tokens=1)
    assert {pid for _, pid in s.marks()} == {str(s.proc.pid)}
    assert "(EngineCore pid=" not in s.log


def test_old_api_server_entrypoint_on_0_10(host, serve):
    site, home = host("0.10.2")
    both_paths_marked(site, "0.10.2")
    s = serve(site, home, ["--model", model_dir(home), "--speculative-config", EAGLE, "--enforce-eager"],
              module=("vllm_standin.api_server",))
    assert s.ready, s.log
    s.complete(max_tokens=1)
    assert {t for t, _ in s.marks()} == {"v1"}
    assert "vLLM API server version 0.10.2" in s.log
    assert "\x1b[1;36m(EngineCore_DP0 pid=" in s.log        # 0.10.x colours the prefix even in a file


# --------------------------------------------------------------------------- engine choices and refusals

def test_0_10_v0_engine_and_fallback(host, serve):
    site, home = host("0.10.2")
    s = serve(site, home, [model_dir(home)], {"VLLM_USE_V1": "0"})
    assert s.ready, s.log
    assert "Initializing a V0 LLM engine (v0.10.2) with config: " in s.log
    assert "Initializing a V1 LLM engine" not in s.log
    s.stop()
    s2 = serve(site, home, [model_dir(home), "--preemption-mode", "swap"])
    assert s2.ready, s2.log
    assert "--preemption-mode is not supported by the V1 Engine. Falling back to V0. " in s2.log
    assert "Falling back to V0. " in wheel_text(site, "vllm/engine/arg_utils.py")
    assert "Initializing a V0 LLM engine" in s2.log


def test_0_10_speculative_decoding_on_v0_is_refused(host, serve):
    site, home = host("0.10.2")
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE], {"VLLM_USE_V1": "0"})
    assert not s.ready and s.proc.wait(30) == 1
    assert "NotImplementedError: Speculative decoding is not supported on vLLM V0." in s.log


def test_0_34_refuses_the_v1_runner(host, serve):
    site, home = host("0.34.0")
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE], {"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert not s.ready and s.proc.wait(30) == 1
    line = vllm_profile.PROFILE.release("0.34.0").choice_line("Model Runner V1 has been remo")["text"]
    assert "ValueError: " + line.replace("\x00", "0") in s.log      # the facts' text, from the same wheel


def test_0_33_unsupported_feature_falls_back_to_v1_with_the_warning(host, serve):
    site, home = host("0.33.0")
    both_paths_marked(site, "0.33.0")
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE, "--enforce-eager", "--enable-lora"])
    assert s.ready, s.log
    s.complete(max_tokens=1)
    assert "Model Runner V2 does not yet support LoRA; using the V1 model runner instead." in s.log
    assert "Using V2 Model Runner" not in s.log and {t for t, _ in s.marks()} == {"v1"}


@pytest.mark.parametrize("arch,runner", [("Qwen2MoeForCausalLM", "v2"), ("LlamaForCausalLM", "v1")])
def test_whitelist_release_picks_v2_by_the_models_architecture(pristine, tmp_path, serve, arch, runner):
    site = tmp_path / "site"
    try:
        install.install_vllm_files(site, "0.27.0")
    except OSError as e:
        pytest.skip(f"vllm 0.27.0 not available: {e}")
    install.install_standin(site)
    home = tmp_path / "home"
    home.mkdir()
    add_mark(site, "vllm/v1/spec_decode/llm_base_proposer.py", "propose", "v1")
    for f in sorted((site / "vllm/v1/worker/gpu/spec_decode").rglob("speculator.py")):
        if "def propose" in f.read_text():
            add_mark(site, str(f.relative_to(site)), "propose", "v2")
    s = serve(site, home, [model_dir(home, [arch]), "--speculative-config", EAGLE, "--enforce-eager"])
    assert s.ready, s.log
    s.complete(max_tokens=1)
    assert {t for t, _ in s.marks()} == {runner}
    assert ("Using V2 Model Runner" in s.log) == (runner == "v2")


def test_banner_without_logo(host, serve):
    site, home = host("0.20.2")
    s = serve(site, home, [model_dir(home)], {"VLLM_DISABLE_LOG_LOGO": "1"})
    assert s.ready, s.log
    assert f"vLLM server version 0.20.2, serving model {model_dir(home)}" in s.log
    s2 = serve(site, home, [model_dir(home)])
    assert s2.ready and "version 0.20.2" in s2.log and "serving model" not in s2.log    # the logo


# --------------------------------------------------------------------------- compile cache

@pytest.mark.parametrize("release", ["0.10.2", "0.33.0"])
def test_compile_cache_traces_once_then_loads_from_the_cache(host, serve, release):
    site, home = host(release)
    both_paths_marked(site, release)
    args = [model_dir(home), "--speculative-config", EAGLE]
    first = serve(site, home, args)
    assert first.ready, first.log
    traced = first.marks()
    assert traced, first.log                                   # the region's Python ran at start-up
    assert "Directly load the compiled graph(s)" not in first.log and "Compiling a graph for" in first.log
    first.stop()
    first.mark.unlink()
    second = serve(site, home, args)
    assert second.ready, second.log
    assert second.marks() == []                                # loaded from the cache: no Python at start-up
    assert "Directly load the compiled graph(s) for" in second.log
    assert "Directly load the compiled graph(s) for" in wheel_text(site, "vllm/compilation/backends.py")
    second.complete(max_tokens=1)
    assert second.marks()                                      # requests still run the propose step
    second.stop()
    second.mark.unlink()
    # a changed drafter file is a new key: traced again
    add_mark(site, V2_PROPOSE.get(release) or V1_PROPOSE[release], "propose", "changed")
    third = serve(site, home, args)
    assert third.ready, third.log
    assert third.marks() and "Directly load the compiled graph(s)" not in third.log


# --------------------------------------------------------------------------- fleetpatch's probe

def venv_site(tmp_path):
    """A virtual environment (the server's interpreter reads its site-packages at start, .pth
    files included, as on a host); returns (python, site-packages)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    out = subprocess.run([str(python), "-c", probe_install.SITE_QUERY], check=True, capture_output=True, text=True)
    return python, Path(probe_install.site_dir_from(json.loads(out.stdout)))


@pytest.mark.parametrize("release,method,multiproc", [("0.34.0", "fork", "1"), ("0.10.2", "spawn", "1"),
                                                      ("0.33.0", "fork", "0")])
def test_the_probe_records_in_the_processes_that_ran_the_patched_drafter(pristine, tmp_path, release, method,
                                                                          multiproc):
    python, site = venv_site(tmp_path)
    shutil.copytree(pristine[release], site, dirs_exist_ok=True)
    source = V2_PROPOSE.get(release) or V1_PROPOSE[release]
    add_mark(site, source, "propose", "patched")
    text = (site / source).read_text().splitlines()
    added = {source: [i + 1 for i, line in enumerate(text) if "STANDIN_MARK" in line]}
    plan = probe_install.make_plan(added, str(site))
    probe_install.install(str(site), str(tmp_path / "probe"), "abc123def456", plan)
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "STANDIN_MARK": str(home / "mark"),
           "VLLM_WORKER_MULTIPROC_METHOD": method, "VLLM_ENABLE_V1_MULTIPROCESSING": multiproc}
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(python), "-m", "vllm_standin", "serve", model_dir(home), "--speculative-config",
                                 EAGLE, "--enforce-eager", "--tensor-parallel-size", "2", "--port", str(port)],
                                cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT)
    s = Server.__new__(Server)
    s.proc, s.port, s.log_path, s.mark = proc, port, log, home / "mark"
    try:
        assert s.wait_ready(), s.log
        s.complete(max_tokens=1)
        ran_in = {pid for _, pid in s.marks()}
    finally:
        assert s.stop() == 0
    procs = parse_records(probe_install.read_records(str(tmp_path / "probe")))
    recorded = {str(p["process"]["pid"]): p for p in procs.values() if p["process"]}
    with_lines = {pid for pid, p in recorded.items() if any(n.startswith(("L-", "F-")) for n, _ in p["records"])}
    assert len(ran_in) == 2 and with_lines == ran_in, (ran_in, recorded.keys(), s.log)
    workers = {s.pid_of("Worker_TP0"), s.pid_of("Worker_TP1")}
    assert workers == ran_in and str(proc.pid) not in workers
    # every process of the server started the probe: API server, EngineCore (unless in-process), workers
    expected = workers | {str(proc.pid)} | ({s.pid_of(engine_core_name(release))} if multiproc == "1" else set())
    assert expected <= set(recorded), (expected, recorded.keys())
    assert not any(n.endswith("disabled") for p in procs.values() for n, _ in p["records"])


def engine_core_name(release):
    return "EngineCore_DP0" if release == "0.10.2" else "EngineCore"


# --------------------------------------------------------------------------- which drafter file runs

def mark_every_propose(site):
    """Mark every `propose` of the V1 drafters and V2 speculators with its own file's path."""
    for d in ("vllm/v1/spec_decode", "vllm/v1/worker/gpu/spec_decode"):
        for f in sorted((Path(site) / d).rglob("*.py")):
            if "def propose(" in f.read_text(encoding="utf-8"):
                rel = str(f.relative_to(site))
                add_mark(site, rel, "propose", rel)


METHOD_CASES = [
    ("0.10.2", "ngram", {}, {"vllm/v1/spec_decode/ngram_proposer.py"}),
    ("0.10.2", "eagle3", {}, {"vllm/v1/spec_decode/eagle.py"}),
    ("0.20.2", "eagle3", {"VLLM_USE_V2_MODEL_RUNNER": "1"}, {"vllm/v1/worker/gpu/spec_decode/eagle/speculator.py"}),
    ("0.33.0", "ngram", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, {"vllm/v1/spec_decode/ngram_proposer.py"}),
    ("0.33.0", "ngram", {}, {"vllm/v1/worker/gpu/spec_decode/ngram/speculator.py"}),
    ("0.33.0", "mtp", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, {"vllm/v1/spec_decode/llm_base_proposer.py"}),
    ("0.34.0", "mtp", {}, {"vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py"}),
]


@pytest.mark.parametrize("release,method,env,files", METHOD_CASES,
                         ids=[f"{c[0]}-{c[1]}-{'-'.join(c[2].values()) or 'default'}" for c in METHOD_CASES])
def test_the_method_picks_its_own_drafter_file(host, serve, release, method, env, files):
    site, home = host(release)
    mark_every_propose(site)
    s = serve(site, home, [model_dir(home), "--speculative-config",
                           json.dumps({"method": method, "num_speculative_tokens": 2}), "--enforce-eager"], env)
    assert s.ready, s.log
    s.complete(max_tokens=1)
    assert {t for t, _ in s.marks()} == files, s.log


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_starts_compiled_with_eagle3_as_a_user_runs_it(host, serve, release):
    """No --enforce-eager, EAGLE-3 with its draft model (as most EAGLE deployments run): the start-up
    trace runs the release's propose step with the launch's config (it once failed an assert of
    0.10.2's and 0.20.2's propose on the stand-in's inputs), then a request runs it again."""
    site, home = host(release)
    mark_every_propose(site)
    draft = Path(home) / "draft"
    draft.mkdir(exist_ok=True)
    (draft / "config.json").write_text(json.dumps({"architectures": ["Eagle3LlamaForCausalLM"]}))
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    s = serve(site, home, [model_dir(home), "--speculative-config", spec])
    assert s.ready, s.log
    assert "Dynamo bytecode transform time" in s.log and "Error" not in s.log, s.log
    at_start = len(s.marks())
    assert at_start >= 1, s.log                         # traced once at start-up
    assert s.complete(max_tokens=1)["choices"][0]["text"]
    assert len(s.marks()) > at_start, s.log


# --------------------------------------------------------------------------- failures

def test_a_patch_that_raises_in_the_drafter_kills_the_engine_and_the_server(host, serve):
    site, home = host("0.33.0")
    path = site / V2_PROPOSE["0.33.0"]
    text = path.read_text()
    add_mark(site, V2_PROPOSE["0.33.0"], "propose", "v2")
    path.write_text(path.read_text().replace(MARK.format(tag="v2"), 'raise RuntimeError("patched drafter failed")'))
    assert path.read_text() != text
    s = serve(site, home, [model_dir(home), "--speculative-config", EAGLE, "--enforce-eager"])
    assert s.ready, s.log
    with pytest.raises(urllib.error.HTTPError) as err:
        s.complete(max_tokens=1)
    assert err.value.code == 500
    assert s.proc.wait(60) == 1
    assert "EngineCore encountered a fatal error." in s.log
    assert "RuntimeError: patched drafter failed" in s.log


def test_0_20_v2_refuses_a_method_it_has_no_speculator_for(host, serve):
    site, home = host("0.20.2")
    s = serve(site, home, [model_dir(home), "--speculative-config", json.dumps({"method": "ngram"})],
              {"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert not s.ready and s.proc.wait(30) == 1
    assert "ValueError: VLLM_USE_V2_MODEL_RUNNER does not yet support: speculative method 'ngram'" in s.log


def test_sigterm_before_ready_stops_the_server_and_its_processes(host, tmp_path):
    site, home = host("0.34.0")
    s = Server.__new__(Server)
    s.port, s.log_path, s.mark = free_port(), home / "server.log", home / "mark"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(site),
           "FLEETPATCH_STANDIN_STARTUP_DELAY": "300"}
    with open(s.log_path, "wb") as out:
        s.proc = subprocess.Popen([sys.executable, "-m", "vllm_standin", "serve", model_dir(home),
                                   "--speculative-config", EAGLE, "--tensor-parallel-size", "2",
                                   "--port", str(s.port)], cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 120
        while "Waiting for application startup." not in s.log and s.proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        workers = [s.pid_of("Worker_TP0"), s.pid_of("Worker_TP1")]
        core = s.pid_of("EngineCore")
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert "Application startup complete." not in s.log and "Application shutdown complete." in s.log
    for pid in workers + [core]:
        end = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower() \
                and time.monotonic() < end:
            time.sleep(0.2)
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_the_probe_sees_the_trace_at_the_first_start_and_nothing_at_a_cached_start(pristine, tmp_path):
    """Compiled (no --enforce-eager): the first start traces the patched propose step (the probe
    records its lines as traced, T-), a request runs it (L-/F-); a restart with the same files
    loads from the cache: nothing at start-up, the request's run only."""
    python, site = venv_site(tmp_path)
    shutil.copytree(pristine["0.33.0"], site, dirs_exist_ok=True)
    source = V2_PROPOSE["0.33.0"]
    add_mark(site, source, "propose", "patched")
    text = (site / source).read_text().splitlines()
    added = {source: [i + 1 for i, line in enumerate(text) if "STANDIN_MARK" in line]}
    probe_dir = tmp_path / "probe"
    probe_install.install(str(site), str(probe_dir), "abc123def456", probe_install.make_plan(added, str(site)))
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "STANDIN_MARK": str(home / "mark")}

    def start():
        s = Server.__new__(Server)
        s.port, s.log_path, s.mark = free_port(), home / f"server-{len(list(home.glob('*.log')))}.log", home / "mark"
        with open(s.log_path, "wb") as out:
            s.proc = subprocess.Popen([str(python), "-m", "vllm_standin", "serve", model_dir(home),
                                       "--speculative-config", EAGLE, "--port", str(s.port)],
                                      cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT)
        assert s.wait_ready(), s.log
        return s

    def kinds(pid):
        procs = parse_records(probe_install.read_records(str(probe_dir)))
        return {n.split("-", 1)[0] for p in procs.values() if p["process"] and str(p["process"]["pid"]) == pid
                for n, _ in p["records"] if n[:2] in ("L-", "F-", "T-")}

    first = start()
    core = first.pid_of("EngineCore")
    assert kinds(core) == {"T"}                     # traced at start-up, not run
    first.complete(max_tokens=1)
    assert kinds(core) >= {"T"} and kinds(core) & {"L", "F"}
    assert first.stop() == 0
    second = start()
    core2 = second.pid_of("EngineCore")
    assert "Directly load the compiled graph(s) for" in second.log
    assert kinds(core2) == set()                    # loaded from the cache: no line of it at start-up
    second.complete(max_tokens=1)
    assert kinds(core2) & {"L", "F"} and "T" not in kinds(core2)
    assert second.stop() == 0
