"""Every fleetpatch command on vLLM hosts (issue 32), over real sshd, each host carrying the real
files of a vLLM release's PyPI wheel and the vLLM stand-in (which builds the drafter or
speculator the launch selects from the host's files and runs its propose step per request):

- 0.10.2 (V1 engine, Model Runner V1) and 0.20.2 (V2 opt-in: V1 by default);
- 0.33.0 (Model Runner V2 by default, V1 still shipped) and 0.34.0 (V2 only);
- 0.33.0 with VLLM_ENABLE_V1_MULTIPROCESSING=0 (EngineCore in the API server's process), and with
  --tensor-parallel-size 2 (two forked workers);
- each release in a container laid out like vllm/vllm-openai (needs the test Docker daemon);
- and an SGLang 0.5.9 host beside them: a mixed fleet, each host judged by its own profile.

Three servers run with an API key, as a careful operator runs them: 0.10.2 and the SGLang host with
`--api-key`, 0.20.2 with VLLM_API_KEY in its environment (and the 0.33.0 container with `--api-key`).
Their stand-ins refuse a request without it as the release does; the agent reads the key from the
server's /proc on the host, and no command of this module prints or reports it (`Cli`).

Every vLLM host runs as a user runs it: EAGLE-3 with its draft model, compiled (no
--enforce-eager), so the first start after a patch traces the propose step.

One fleet for the module (seven server starts, and four containers with the Docker daemon); each test leaves its hosts rolled back.
The patches: the shipped demo patches (eagle-drafter-line: both EAGLE paths of 0.33.0, the
speculator on 0.34.0; vllm-v1-only-beacon: V1's eagle.py only), and `propose-line` /
`propose-v2`, written here from the hosts' own wheel files: one line added as the first
statement of the propose step that the release's runner calls (the drafter's base class on
0.20.2 and the speculator's base on 0.33.0).
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo import vllm_hosts
from fleetpatch_demo.fleet import Fleet, HostSpec

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD), reason="needs root and /usr/sbin/sshd")

DEMO_PATCHES = Path(fleetmod.__file__).resolve().parent / "patches"
FIXTURE_PATCHES = Path(__file__).resolve().parents[1] / "fixtures" / "patches"
# the servers' API keys: read on the host, never in what fleetpatch prints or reports
KEYS = {"v010": "sk-v010-cli-7d1e93", "v020": "sk-v020-env-52ab0c", "s059": "sk-s059-cli-e1f4a8",
        "c033": "sk-c033-cli-90c6d2"}
SPECS = [
    HostSpec("v010", version="0.10.2", engine="vllm", args=("--api-key", KEYS["v010"])),
    HostSpec("v020", version="0.20.2", engine="vllm", env={"VLLM_API_KEY": KEYS["v020"]}),
    HostSpec("v033", version="0.33.0", engine="vllm"),
    HostSpec("v034", version="0.34.0", engine="vllm"),
    HostSpec("v033mp0", version="0.33.0", engine="vllm", env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
    HostSpec("v033tp2", version="0.33.0", engine="vllm", args=("--tensor-parallel-size", "2")),
    # no warm-up request: a line that runs per request is proven by the smoke request alone
    HostSpec("s059", version="0.5.9", spec_v2=True, args=("--api-key", KEYS["s059"], "--skip-server-warmup")),
]
# one container per release, laid out like vllm/vllm-openai (one image per release)
CONTAINERS = [HostSpec("c010", version="0.10.2", engine="vllm", container=True),
              HostSpec("c020", version="0.20.2", engine="vllm", container=True),
              HostSpec("c033", version="0.33.0", engine="vllm", container=True, args=("--api-key", KEYS["c033"])),
              HostSpec("c034", version="0.34.0", engine="vllm", container=True)]
V1_EAGLE = "vllm/v1/spec_decode/eagle.py"
V2_EAGLE = "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py"
# where the propose step that the release's runner calls is defined, for the propose-line patches
PROPOSE = {"0.10.2": V1_EAGLE, "0.20.2": "vllm/v1/spec_decode/llm_base_proposer.py",
           "0.33.0": "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py"}
CACHE_LINE = "Directly load the compiled graph(s) for compile range"   # vllm/compilation/backends.py


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def with_line(version: str, path: str, func: str = "propose") -> str:
    """A unified diff of the release's `path` that adds one statement as the first line of `func`."""
    text = (vllm_hosts.vllm_tree(version) / path).read_text(encoding="utf-8")
    first = min(n.body[0].lineno for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == func)
    lines = text.splitlines(keepends=True)
    indent = len(lines[first - 1]) - len(lines[first - 1].lstrip())
    new = lines[:first - 1] + [" " * indent + "self._fleetpatch_proposed = True\n"] + lines[first - 1:]
    return "".join(difflib.unified_diff(lines, new, "a/" + path, "b/" + path))


def write_patches(root: Path) -> Path:
    """The demo patches, and propose-line (0.10.2, 0.20.2) and propose-v2 (0.33.0) from the wheels."""
    out = root / "patches"
    for name in ("eagle-drafter-line", "vllm-v1-only-beacon"):
        shutil.copytree(DEMO_PATCHES / name, out / name)
    shutil.copytree(FIXTURE_PATCHES / "forward-quiet", out / "forward-quiet")
    line = out / "propose-line"
    line.mkdir()
    (line / "v0102.diff").write_text(with_line("0.10.2", PROPOSE["0.10.2"]))
    (line / "v0202.diff").write_text(with_line("0.20.2", PROPOSE["0.20.2"]))
    (line / "patch.yaml").write_text(
        "name: propose-line\nsummary: a line in Model Runner V1's propose step\nengine: vllm\nrevisions:\n"
        "  - {rev: 1, diff: v0102.diff, engine_versions: \"==0.10.2\"}\n"
        "  - {rev: 2, diff: v0202.diff, engine_versions: \"==0.20.2\"}\n"
        "forbid: [\"Traceback (most recent call last)\"]\n")
    v2 = out / "propose-v2"
    v2.mkdir()
    (v2 / "r1.diff").write_text(with_line("0.33.0", PROPOSE["0.33.0"]))
    # no smoke request: what runs at start-up alone decides (the compile cache's case)
    (v2 / "patch.yaml").write_text(
        "name: propose-v2\nsummary: a line in the V2 speculators' propose step\nengine: vllm\nrevisions:\n"
        "  - {rev: 1, diff: r1.diff, engine_versions: \"==0.33.0\"}\nprove: {requests: 0, wait: 1}\n")
    return out


class Cli:
    """fleetpatch as the operator runs it, in a folder holding the fleet's hosts.yaml."""

    def __init__(self, workdir: Path, fleet: Fleet, patches: Path):
        self.workdir, self.patches = workdir, patches
        fleet.write_inventory(workdir / "hosts.yaml")
        self.runs = 0

    def __call__(self, *args: str, timeout: float = 300) -> tuple[int, str, dict]:
        self.runs += 1
        report = self.workdir / f"report-{self.runs}.json"
        patches = ["--patches", str(self.patches)] if args[0] in ("check-patch", "deploy-patch", "rollout") else []
        argv = [sys.executable, "-m", "fleetpatch", args[0], "--report", str(report), *patches, *args[1:]]
        proc = subprocess.run(argv, cwd=self.workdir, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "200"})
        written = report.read_text() if report.exists() else ""
        # a server's API key never leaves its host: not on the terminal, not in the report
        for host, key in KEYS.items():
            assert key not in proc.stdout and key not in proc.stderr and key not in written, (host, args)
        return proc.returncode, proc.stdout + proc.stderr, json.loads(written) if written else {}


@pytest.fixture(scope="module")
def vfleet(tmp_path_factory, request):
    specs = list(SPECS)
    sock = None
    if os.environ.get("FLEETPATCH_TEST_DOCKER_SOCK"):
        request.getfixturevalue("docker_daemon")
        sock = os.environ["FLEETPATCH_TEST_DOCKER_SOCK"]
        specs.extend(CONTAINERS)
    root = tmp_path_factory.mktemp("vllm-fleet")
    with Fleet(root, specs, docker_sock=sock) as f:
        yield f


@pytest.fixture(scope="module")
def cli(vfleet, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-operator")
    return Cli(work, vfleet, write_patches(work))


def host_file(fleet: Fleet, name: str, path: str) -> Path:
    return fleet.hosts[name].site_packages / path


def pristine(version: str, path: str) -> str:
    return sha256(vllm_hosts.vllm_tree(version) / path)


# ------------------------------------------------------------------ status, fetch, check-patch

def test_status_names_each_vllm_release_and_the_sglang_one(cli):
    rc, out, doc = cli("status", "--hosts", "v010,v020,v033,v034,s059")
    assert rc == 0, out
    assert {h: r["engine_version"] for h, r in doc["hosts"].items()} == {
        "v010": "0.10.2", "v020": "0.20.2", "v033": "0.33.0", "v034": "0.34.0", "s059": "0.5.9"}


def test_check_patch_applies_per_release_and_refuses_the_other_engine(cli, vfleet):
    before = sha256(host_file(vfleet, "v033", V2_EAGLE))
    rc, out, doc = cli("check-patch", "--patch", "eagle-drafter-line", "--hosts", "v033,v034,s059")
    hosts = doc["hosts"]
    assert hosts["v033"]["status"] == "applies" and hosts["v033"]["patch"] == "eagle-drafter-line@1"
    assert hosts["v034"]["status"] == "applies" and hosts["v034"]["patch"] == "eagle-drafter-line@2"
    assert hosts["v033"]["executed_path"] == hosts["v034"]["executed_path"] == "EagleSpeculator"
    assert hosts["s059"]["ok"] is False and "vllm" in hosts["s059"]["message"].lower()   # a vLLM patch on SGLang
    assert rc == 1
    assert sha256(host_file(vfleet, "v033", V2_EAGLE)) == before


# ------------------------------------------------------------------ deploy, verify-logs, rollback

def test_v1_runner_releases_verified_by_the_smoke_completion_then_rolled_back(cli, vfleet):
    rc, out, doc = cli("check-patch", "--patch", "propose-line", "--hosts", "v010,v020")
    assert rc == 0, out
    assert {h: (r["status"], r["patch"], r["executed_path"]) for h, r in doc["hosts"].items()} == {
        "v010": ("applies", "propose-line@1", "EagleProposer"), "v020": ("applies", "propose-line@2", "EagleProposer")}
    rc, out, doc = cli("deploy-patch", "--patch", "propose-line", "--hosts", "v010,v020")
    assert rc == 0, out
    for name, version, rev in (("v010", "0.10.2", 1), ("v020", "0.20.2", 2)):
        r = doc["hosts"][name]
        assert (r["status"], r["patch"], r["executed_path"]) == ("verified", f"propose-line@{rev}", "EagleProposer")
        exe = r["execution"]
        assert list(exe["ran"]) == [PROPOSE[version]] and exe["proved_by"] == "smoke"
        assert exe["ran_in"] == ["EngineCore"]
        assert r["smoke"]["statuses"] == [200]     # POST /v1/completions, judged by choices[0].text
        assert sha256(host_file(vfleet, name, PROPOSE[version])) != pristine(version, PROPOSE[version])
    rc, out, doc = cli("verify-logs", "--hosts", "v010,v020")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"verified"}, out
    rc, out, doc = cli("rollback", "--hosts", "v010,v020")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"rolled-back"}, out
    for name, version in (("v010", "0.10.2"), ("v020", "0.20.2")):
        assert sha256(host_file(vfleet, name, PROPOSE[version])) == pristine(version, PROPOSE[version])
    # the same through rollout (canary, then the rest), and back
    rc, out, doc = cli("rollout", "--patch", "propose-line", "--hosts", "v010,v020", "--canary", "1")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"verified"}, out
    rc, out, doc = cli("rollback", "--hosts", "v010,v020")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"rolled-back"}, out


def test_v2_runner_releases_verified_in_the_speculator_then_rolled_back(cli, vfleet):
    rc, out, doc = cli("deploy-patch", "-v", "--patch", "eagle-drafter-line", "--hosts", "v033,v034")
    assert rc == 0, out
    for name in ("v033", "v034"):
        r = doc["hosts"][name]
        assert r["status"] == "verified" and r["executed_path"] == "EagleSpeculator", out
        assert list(r["execution"]["ran"]) == [V2_EAGLE]
        assert any(m["text"].startswith("eagle-drafter-line: EagleSpeculator (V2 model runner)") for m in r["markers"])
    assert "Using V2 Model Runner" in out          # the runner-choice line quoted as evidence (0.33.0)
    rc, out, doc = cli("verify-logs", "--hosts", "v033,v034")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"verified"}, out
    rc, out, doc = cli("status", "--hosts", "v033,v034")
    assert rc == 0 and all(r["ok"] for r in doc["hosts"].values()), out
    rc, out, doc = cli("rollback", "--hosts", "v033,v034")
    assert rc == 0, out
    assert sha256(host_file(vfleet, "v033", V1_EAGLE)) == pristine("0.33.0", V1_EAGLE)
    assert sha256(host_file(vfleet, "v034", V2_EAGLE)) == pristine("0.34.0", V2_EAGLE)


def test_the_verdict_names_the_process_the_line_ran_in(cli):
    """EngineCore in the API server's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), and two forked
    workers (--tensor-parallel-size 2): the probe is in each, and the verdict says which ran it."""
    rc, out, doc = cli("deploy-patch", "--patch", "eagle-drafter-line", "--hosts", "v033mp0,v033tp2")
    one, two = doc["hosts"]["v033mp0"], doc["hosts"]["v033tp2"]
    assert rc == 0 and one["status"] == two["status"] == "verified", out
    assert one["execution"]["ran_in"] == ["API server"] and len(one["execution"]["pids"]) == 1
    assert two["execution"]["ran_in"] == ["Worker"] and len(two["execution"]["pids"]) >= 4   # API, EngineCore, 2 workers
    assert "; in Worker)" in two["message"]
    rc, out, _ = cli("rollback", "--hosts", "v033mp0,v033tp2")
    assert rc == 0, out


# ------------------------------------------------------------------ the one-path mistake

def test_a_v1_only_fix_on_a_v2_runner_is_refused_and_forced_not_executed(cli, vfleet):
    before = sha256(host_file(vfleet, "v033", V1_EAGLE))
    rc, out, doc = cli("check-patch", "--patch", "vllm-v1-only-beacon", "--hosts", "v033")
    assert rc == 1 and doc["hosts"]["v033"]["status"] == "not-executed", out
    assert "would never execute (pre-flight)" in out and f"the server will run EagleSpeculator ({V2_EAGLE})" in out
    rc, out, doc = cli("deploy-patch", "--patch", "vllm-v1-only-beacon", "--hosts", "v033")
    assert rc == 1 and sha256(host_file(vfleet, "v033", V1_EAGLE)) == before, out   # refused: nothing written
    rc, out, doc = cli("deploy-patch", "--force", "--patch", "vllm-v1-only-beacon", "--hosts", "v033")
    r = doc["hosts"]["v033"]
    assert rc == 1 and r["status"] == "not-executed", out
    assert f"{V1_EAGLE}: never imported" in r["message"]
    assert f"the server runs EagleSpeculator ({V2_EAGLE})" in r["message"]
    assert 'evidence: log line' in r["message"] and "Using V2 Model Runner" in r["message"]
    assert r["execution"]["not_run"] == {V1_EAGLE: "never imported", V2_EAGLE: "imported, but this revision does not change it"}
    rc, out, _ = cli("rollback", "--hosts", "v033")
    assert rc == 0 and sha256(host_file(vfleet, "v033", V1_EAGLE)) == before, out


# ------------------------------------------------------------------ compiled from the cache

def test_a_restart_that_loads_the_compiled_graph_from_the_cache_is_not_not_executed(cli):
    # the first start after the patch traces the patched source (the probe records the lines as traced)
    rc, out, doc = cli("deploy-patch", "--patch", "propose-v2", "--hosts", "v033")
    first = doc["hosts"]["v033"]
    assert rc == 0 and first["status"] == "verified" and first["execution"]["proved_by"] == "trace", out
    assert list(first["execution"]["compiled"]["traced"]) == [PROPOSE["0.33.0"]] and not first["execution"]["ran"]
    assert "executed under trace" in first["message"]
    rc, out, _ = cli("rollback", "--hosts", "v033")
    assert rc == 0, out
    rc, out, doc = cli("deploy-patch", "--patch", "propose-v2", "--hosts", "v033")   # the same sources: cached
    r = doc["hosts"]["v033"]
    assert rc == 1 and r["status"] == "unproven", out
    assert "the patched code was compiled from the cache" in r["message"] and CACHE_LINE in r["message"]
    assert "--enforce-eager" in r["message"] and "torch_compile_cache" in r["message"]
    assert r["execution"]["compiled"]["from_cache"] is True and r["execution"]["proved_by"] is None
    rc, out, _ = cli("rollback", "--hosts", "v033")
    assert rc == 0, out


# ------------------------------------------------------------------ a mixed fleet, rolled out per engine

def test_a_mixed_fleet_rolls_out_per_engine(cli, vfleet):
    sglang_file = vfleet.hosts["s059"].site_packages / "sglang/srt/speculative/eagle_worker_v2.py"
    before = sha256(sglang_file)
    rc, out, doc = cli("rollout", "--patch", "eagle-drafter-line", "--hosts", "v033,v034", "--canary", "1")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"verified"}, out
    rc, out, doc = cli("rollout", "--patch", "spec-path-beacon", "--hosts", "s059", "--canary", "0")
    assert rc == 0 and doc["hosts"]["s059"]["status"] == "verified", out
    assert doc["hosts"]["s059"]["executed_path"] == "EAGLEWorkerV2"
    # the vLLM patch over the whole mixed fleet: the SGLang host is refused, nothing written there
    rc, out, doc = cli("check-patch", "--patch", "eagle-drafter-line", "--hosts", "v033,s059")
    assert doc["hosts"]["v033"]["status"] == "already-applied" and doc["hosts"]["s059"]["ok"] is False, out
    assert sha256(sglang_file) != before            # spec-path-beacon is on it, and only that
    rc, out, doc = cli("status", "--hosts", "v033,v034,s059")
    assert rc == 0, out
    rc, out, _ = cli("rollback", "--hosts", "v033,v034,s059")
    assert rc == 0 and sha256(sglang_file) == before, out


# ------------------------------------------------------------------ servers started with an API key

def direct(fleet: Fleet, name: str, path: str, key: str | None = None) -> tuple[int, bytes]:
    """A GET from here straight to the host's server, not through fleetpatch: (status, body)."""
    req = urllib.request.Request(f"http://127.0.0.1:{fleet.hosts[name].http_port}{path}",
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_servers_started_with_an_api_key_are_proven_by_their_smoke_request(cli, vfleet):
    """The stand-ins refuse a request without the key as the release does (vLLM 0.10.2 and 0.20.2:
    /v1 paths; SGLang 0.5.9: all but /health and /metrics); fleetpatch's smoke requests and
    /server_info, sent by the agent with the key it read from each server's /proc, are answered.
    (The vLLM hosts' deploy, proven by the smoke completion, is test_v1_runner_releases_...; `Cli`
    checks that no key is in any command's output or report.)"""
    for name, path in (("v010", "/v1/models"), ("v020", "/v1/models"), ("s059", "/server_info")):
        assert direct(vfleet, name, path) == (401, b'{"error":"Unauthorized"}'), name
        assert direct(vfleet, name, path, KEYS[name])[0] == 200, name
        assert direct(vfleet, name, "/health")[0] == 200, name
    rc, out, doc = cli("deploy-patch", "-v", "--patch", "forward-quiet", "--hosts", "s059")
    r = doc["hosts"]["s059"]
    assert rc == 0 and r["status"] == "verified" and r["executed_path"] == "EAGLEWorkerV2", out
    # --skip-server-warmup: only the smoke request ran the line, and it was answered
    assert r["execution"]["proved_by"] == "smoke" and r["smoke"]["statuses"] == [200], r
    assert '/server_info: {' in out and '"api_key": "***"' in out   # read with the key
    rc, out, doc = cli("rollback", "--hosts", "s059")
    assert rc == 0 and doc["hosts"]["s059"]["status"] == "rolled-back", out
    assert doc["hosts"]["s059"]["smoke"]["statuses"] == [200]


# ------------------------------------------------------------------ a container host

def test_vllm_container_hosts_of_each_release_check_deploy_verify_status_rollout_and_roll_back(cli, vfleet):
    names = [c.name for c in CONTAINERS]
    if not all(n in vfleet.hosts for n in names):
        pytest.skip("needs the test Docker daemon (FLEETPATCH_TEST_DOCKER_SOCK)")
    rc, out, doc = cli("status", "--hosts", ",".join(names))
    assert rc == 0, out
    assert {h: r["engine_version"] for h, r in doc["hosts"].items()} == {c.name: c.version for c in CONTAINERS}
    rc, out, doc = cli("check-patch", "--patch", "propose-line", "--hosts", "c010,c020")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"applies"}, out
    rc, out, doc = cli("deploy-patch", "--patch", "propose-line", "--hosts", "c010,c020")
    assert rc == 0, out
    for name in ("c010", "c020"):
        r = doc["hosts"][name]
        assert r["status"] == "verified" and r["executed_path"] == "EagleProposer", out
        assert list(r["execution"]["ran"]) == [PROPOSE[r["engine_version"]]]
    rc, out, doc = cli("rollout", "--patch", "eagle-drafter-line", "--hosts", "c033,c034", "--canary", "1")
    assert rc == 0, out
    for name in ("c033", "c034"):
        r = doc["hosts"][name]
        assert r["status"] == "verified" and list(r["execution"]["ran"]) == [V2_EAGLE], out
    rc, out, doc = cli("verify-logs", "--hosts", ",".join(names))
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"verified"}, out
    rc, out, doc = cli("status", "--hosts", ",".join(names))
    assert rc == 0 and all(r["ok"] for r in doc["hosts"].values()), out
    rc, out, doc = cli("rollback", "--hosts", ",".join(names))
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"rolled-back"}, out
    # the other way round: rollout on the V1-runner releases, deploy-patch on 0.34.0 (0.33.0's: below)
    rc, out, doc = cli("rollout", "--patch", "propose-line", "--hosts", "c010,c020", "--canary", "1")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"verified"}, out
    rc, out, doc = cli("deploy-patch", "--patch", "eagle-drafter-line", "--hosts", "c034")
    assert rc == 0 and doc["hosts"]["c034"]["status"] == "verified", out
    rc, out, doc = cli("rollback", "--hosts", "c010,c020,c034")
    assert rc == 0 and {r["status"] for r in doc["hosts"].values()} == {"rolled-back"}, out


def test_a_vllm_container_host_deploys_verifies_and_rolls_back(cli, vfleet):
    if "c033" not in vfleet.hosts:
        pytest.skip("needs the test Docker daemon (FLEETPATCH_TEST_DOCKER_SOCK)")
    # started with --api-key: the agent reads it from the container's process, seen from the host
    assert direct(vfleet, "c033", "/v1/models") == (401, b'{"error":"Unauthorized"}')
    rc, out, doc = cli("deploy-patch", "--patch", "eagle-drafter-line", "--hosts", "c033")
    r = doc["hosts"]["c033"]
    assert rc == 0 and r["status"] == "verified" and r["engine_version"] == "0.33.0", out
    assert list(r["execution"]["ran"]) == [V2_EAGLE] and r["smoke"]["statuses"] == [200]
    rc, out, doc = cli("verify-logs", "--hosts", "c033")
    assert rc == 0 and doc["hosts"]["c033"]["status"] == "verified", out
    rc, out, doc = cli("rollback", "--hosts", "c033")
    assert rc == 0 and doc["hosts"]["c033"]["status"] == "rolled-back", out
