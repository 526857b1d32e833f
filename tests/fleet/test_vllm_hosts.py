"""vLLM hosts of the test fleet (``HostSpec(engine="vllm")``): real sshd hosts carrying the
real files of four vLLM releases (the PyPI wheels' members) and the vLLM stand-in, started
as ``vllm serve`` is (``python -m vllm_standin serve MODEL --speculative-config ...``):

* 0.10.2: V0 and V1 (V1 by default; EagleProposer), started the older way too
  (``python -m vllm_standin.api_server --model M``, as ``-m vllm.entrypoints.openai.api_server``);
* 0.20.2: Model Runner V2 opt-in (V1 by default: EagleProposer);
* 0.33.0: Model Runner V2 by default (EagleSpeculator), V1 with VLLM_USE_V2_MODEL_RUNNER=0;
* 0.34.0: V2 only (EagleSpeculator).

Each comes up, answers /health and POST /v1/completions, and runs the drafter code of the
host's own files: a line written into the file of the path the release runs (over SSH, the
way an operator would) is printed by the restarted server, and the same line in the other
runner's file is not.  The container host runs the vLLM image laid out like
vllm/vllm-openai (vLLM in the system dist-packages, the stand-in as the entrypoint), on the
tests' Docker daemon, its log the container's output.
"""
from __future__ import annotations

import ast
import json
import os
import shlex
import time
import urllib.request

import pytest

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo import images, vllm_hosts
from fleetpatch_demo.fleet import Fleet, HostSpec

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD), reason="needs root and /usr/sbin/sshd"),
    pytest.mark.skipif(not vllm_hosts.standin_available(), reason="the vLLM stand-in is not there yet"),
]

DRAFTER = "vllm/v1/spec_decode/eagle.py"
SPECULATOR = "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py"
V1_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
# host: (release, env, restart kind, the file of the EAGLE path it runs, the class there, the other runner's file)
HOSTS = {
    "v0102": ("0.10.2", {}, "command", DRAFTER, "EagleProposer", None),
    "v0102api": ("0.10.2", {}, "command", DRAFTER, "EagleProposer", None),
    "v0202": ("0.20.2", {}, "supervisor", DRAFTER, "EagleProposer", SPECULATOR),
    "v0330": ("0.33.0", {}, "command", SPECULATOR, "EagleSpeculator", DRAFTER),
    "v0330v1": ("0.33.0", V1_ENV, "supervisor", DRAFTER, "EagleProposer", SPECULATOR),
    "v0340": ("0.34.0", {}, "command", SPECULATOR, "EagleSpeculator", None),
}
READY = "Application startup complete."


@pytest.fixture(scope="module")
def vllm_fleet(tmp_path_factory):
    specs = [HostSpec(n, version=v, engine="vllm", env=env, restart_kind=kind, startup_delay=0.1,
                      entrypoint="api_server" if n.endswith("api") else "serve")
             for n, (v, env, kind, *_rest) in HOSTS.items()]
    with Fleet(tmp_path_factory.mktemp("vllm-fleet"), specs) as fleet:
        yield fleet


def completions(port: int, prompt: str = "The capital of France is") -> dict:
    body = json.dumps({"model": "/models/demo", "prompt": prompt, "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def instrument(text: str, cls: str, line: str) -> str:
    """`text` with `line` as the first statement of `cls`'s own __init__ (else its own
    load_draft_model: 0.33's EagleSpeculator has no __init__ of its own), indented as that body is."""
    tree = ast.parse(text)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    own = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
    func = own.get("__init__") or own["load_draft_model"]
    first = func.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and len(func.body) > 1:
        first = func.body[1]   # after the docstring
    lines = text.splitlines(keepends=True)
    indent = " " * first.col_offset
    lines.insert(first.lineno - 1, f"{indent}{line}\n")
    return "".join(lines)


def beacon(cls: str, tag: str) -> tuple[str, str]:
    """(the line to insert, what it prints): a write to stderr, which the server's log holds."""
    text = f"fleetpatch vllm-host test {tag}: {cls} ran"
    return f"__import__('sys').stderr.write({text!r} + chr(10))", text


def wait_for(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def restart(fleet: Fleet, name: str) -> None:
    fleet.stop_server(name)
    fleet.start_server(name)
    fleet.wait_healthy([name], timeout=60)


def test_inventory_entries_are_vllm_hosts(vllm_fleet):
    inv = vllm_fleet.inventory()
    for name, (version, env, kind, *_rest) in HOSTS.items():
        h = vllm_fleet.hosts[name]
        entry = inv["hosts"][name]
        assert entry["engine"] == {"kind": "vllm", "python": f"{h.mount_point}/vllm env/bin/python"}
        assert entry["server"]["log"] == f"{h.mount_point}/logs/vllm.log"
        restart_doc = entry["server"]["restart"]
        if kind == "supervisor":
            assert restart_doc["kind"] == "supervisor" and restart_doc["program"] == "vllm"
            conf = h.supervisord_conf.read_text()
            assert "[program:vllm]" in conf and "-m vllm_standin serve" in conf
        else:
            argv = shlex.split(restart_doc["start"])
            if name.endswith("api"):
                assert argv[:3] == ["{python}", "-m", "vllm_standin.api_server"]
                assert argv[argv.index("--model") + 1] == f"{h.mount_point}/models/demo"
            else:
                assert argv[:4] == ["{python}", "-m", "vllm_standin", "serve"]
                assert argv[4] == f"{h.mount_point}/models/demo"
            spec = json.loads(argv[argv.index("--speculative-config") + 1])
            assert spec["method"] == vllm_hosts.DEFAULT_METHOD == "eagle3" and spec["model"] == f"{h.mount_point}/models/demo-draft"
            assert restart_doc["pidfile"] == f"{h.mount_point}/run/vllm.pid"
            assert {k: restart_doc["env"][k] for k in env} == env


def test_hosts_carry_the_release_files(vllm_fleet):
    for name, (version, *_rest) in HOSTS.items():
        h = vllm_fleet.hosts[name]
        proc = vllm_fleet.ssh(name, shlex.join([h.remote_python, "-c",
                                                "import importlib.metadata as m, importlib.util as u; "
                                                "print(m.version('vllm')); print(u.find_spec('vllm').origin)"]))
        assert proc.returncode == 0, proc.stderr
        got_version, origin = proc.stdout.splitlines()
        assert got_version == version
        assert origin == f"{h.remote_site_packages}/vllm/__init__.py"
        # byte for byte the wheel's members
        tree = vllm_hosts.vllm_tree(version)
        for rel in (DRAFTER, SPECULATOR, "vllm/envs.py"):
            src = tree / rel
            if src.exists():
                assert (h.site_packages / rel).read_bytes() == src.read_bytes(), (name, rel)
        assert (h.site_packages / "vllm_standin" / "__init__.py").is_file()


def test_hosts_serve_health_and_completions(vllm_fleet):
    for name in HOSTS:
        h = vllm_fleet.hosts[name]
        assert vllm_fleet.healthy(name)
        doc = completions(h.http_port)
        assert doc.get("choices"), doc
        wait_for(lambda: READY in h.log_path.read_text(errors="replace"), what=f"{name}: {READY!r} in its log")


def test_hosts_run_the_drafter_of_their_own_files(vllm_fleet):
    """A line written into the file of the path each host runs is printed by its restarted
    server; the same line in the other runner's file (where the release has one) is not."""
    try:
        for name, (version, env, kind, path_file, cls, other_file) in HOSTS.items():
            h = vllm_fleet.hosts[name]
            ran_line, ran_text = beacon(cls, "runs")
            target = h.site_packages / path_file
            target.write_text(instrument(target.read_text(), cls, ran_line))
            not_text = None
            if other_file:
                other_cls = "EagleSpeculator" if other_file == SPECULATOR else "EagleProposer"
                not_line, not_text = beacon(other_cls, "must not run")
                other = h.site_packages / other_file
                other.write_text(instrument(other.read_text(), other_cls, not_line))
            start = h.log_path.stat().st_size
            restart(vllm_fleet, name)
            completions(h.http_port)

            def new_log():
                with open(h.log_path, "rb") as f:
                    f.seek(start)
                    return f.read().decode(errors="replace")
            wait_for(lambda: ran_text in new_log(), what=f"{name}: {ran_text!r}")
            wait_for(lambda: READY in new_log(), what=f"{name}: {READY!r}")
            if not_text:
                assert not_text not in new_log(), (name, new_log()[-2000:])
            assert "Traceback (most recent call last)" not in new_log(), new_log()[-3000:]
    finally:
        vllm_fleet.reset_all()


# ---------------------------------------------------------------- a container host


@pytest.fixture(scope="module")
def vllm_container_fleet(docker_daemon, tmp_path_factory):
    specs = [HostSpec("cv033", version="0.33.0", engine="vllm", container=True, startup_delay=0.1)]
    with Fleet(tmp_path_factory.mktemp("vllm-cfleet"), specs, docker_sock=docker_daemon.sock) as fleet:
        yield fleet


def test_container_host_is_laid_out_like_vllm_openai(vllm_container_fleet):
    fleet = vllm_container_fleet
    h = fleet.hosts["cv033"]
    assert h.container_name.startswith("vllm-cv033-")
    inv = fleet.inventory()["hosts"]["cv033"]
    assert inv["engine"] == {"kind": "vllm", "python": "python3", "container": h.container_name, "runtime": "docker"}
    assert inv["server"]["log"] == "container" and inv["server"]["restart"]["kind"] == "container"
    doc = fleet.docker.inspect_container(h.container_name)
    assert doc["Config"]["Entrypoint"] == ["python3", "-m", "vllm_standin", "serve"]
    assert doc["Config"]["WorkingDir"] == "/vllm-workspace"
    assert "VLLM_USAGE_SOURCE=production-docker-image" in doc["Config"]["Env"]
    assert doc["Config"]["Cmd"][0] == "/models/demo" and "--speculative-config" in doc["Config"]["Cmd"]
    where = fleet.docker_cli("exec", h.container_name, "python3", "-c",
                             "import importlib.metadata as m, importlib.util as u; "
                             "print(m.version('vllm'), u.find_spec('vllm').origin)").stdout.split()
    assert where == ["0.33.0", images.container_package_dir("vllm") + "/__init__.py"]
    assert where[1].startswith("/usr/local/lib/python3.") and "/dist-packages/vllm/" in where[1]


def test_container_host_serves_and_logs_to_the_container(vllm_container_fleet):
    fleet = vllm_container_fleet
    h = fleet.hosts["cv033"]
    assert fleet.healthy("cv033")
    assert completions(h.http_port).get("choices")
    logs = lambda: fleet.docker_cli("logs", h.container_name, check=False)  # noqa: E731
    wait_for(lambda: READY in (logs().stdout + logs().stderr), what="the ready line in docker logs")


def test_container_host_runs_the_speculator_of_its_files(vllm_container_fleet):
    """0.33.0 in its container runs Model Runner V2: a line written into the image's
    speculator.py (inside the container) is printed after a docker stop/start."""
    fleet = vllm_container_fleet
    h = fleet.hosts["cv033"]
    path = images.container_package_dir("vllm") + "/v1/worker/gpu/spec_decode/eagle/speculator.py"
    text = fleet.docker_cli("exec", h.container_name, "cat", path).stdout
    line, printed = beacon("EagleSpeculator", "in a container")
    new = instrument(text, "EagleSpeculator", line)
    fleet.docker_cli("exec", "-i", h.container_name, "python3", "-c",
                     f"import sys; open({path!r}, 'w').write(sys.stdin.read())", input=new)
    try:
        fleet.stop_server("cv033")
        fleet.start_server("cv033")
        fleet.wait_healthy(["cv033"], timeout=60)
        completions(h.http_port)
        logs = lambda: fleet.docker_cli("logs", h.container_name, check=False)  # noqa: E731
        wait_for(lambda: printed in (logs().stdout + logs().stderr), what=f"{printed!r} in docker logs")
    finally:
        fleet.reset_all()
