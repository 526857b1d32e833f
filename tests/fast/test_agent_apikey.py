"""A server started with an API key: the agent reads the key on the host from the server's own
process (/proc/PID/cmdline, and VLLM_API_KEY in /proc/PID/environ), sends it as
`Authorization: Bearer <key>`, and never lets it leave the host; a 401 says whether the key could be
read. Against real processes and a real HTTP server that refuses as vLLM 0.33.0 does (the stand-in's
check, quoted from the release's authenticate.py)."""
from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import select
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetpatch import protocol
from fleetpatch.agent import apikey
from fleetpatch.agent.procs import proc_launch
from fleetpatch.agent.smoke import SmokeRequests
from fleetpatch.agent.state import AgentState
from fleetpatch.engines import get as get_profile
from fleetpatch.steps.follow import smoke_failure
from fleetpatch_demo.standins.vllm.auth import ApiKeyCheck
from support.follows import follow_of

KEY = "sk-fleetpatch-test-4f9a2c"


@pytest.mark.parametrize("cmdline, key", [
    (b"python3\0-m\0sglang.launch_server\0--api-key\0" + KEY.encode() + b"\0--port\x0030000\0", KEY),
    (b"vllm\0serve\0m\0--api-key=" + KEY.encode() + b"\0", KEY),
    (b"vllm\0serve\0m\0--api_key\0" + KEY.encode() + b"\0", KEY),                  # vLLM takes either spelling
    (b"vllm\0serve\0m\0--api-key\0k1\0k2\0--port\x008000\0", "k1"),                  # 0.10.1+: several keys
    (b"x\0--api-key\0old\0--api-key\0new\0", "new"),                                # argparse keeps the last
    (b"x\0--admin-api-key\0adm\0", None),                                          # SGLang's admin key is not it
    (b"x\0--api-key=\0", None),                                                    # empty: no middleware
    (b"sh\0-c\0exec python3 -m sglang.launch_server --api-key " + KEY.encode() + b" --port 1\0", KEY),
    (b"", None),
])
def test_the_key_is_read_from_a_command_line_as_the_server_parses_it(cmdline, key):
    assert apikey.server_key(cmdline, lambda: b"", None)[0] == key


def test_the_flag_goes_before_VLLM_API_KEY_and_only_vllm_reads_the_variable():
    environ = b"PATH=/bin\0VLLM_API_KEY=from-env-123\0"
    assert apikey.server_key(b"vllm\0serve\0m\0", lambda: environ, "VLLM_API_KEY") == ("from-env-123", "VLLM_API_KEY")
    assert apikey.server_key(b"vllm\0serve\0m\0--api-key\0cli\0", lambda: environ, "VLLM_API_KEY") == ("cli", "--api-key")
    assert apikey.server_key(b"python3\0-m\0sglang.launch_server\0", lambda: environ, None) == (None, None)
    # a shell's `--api-key $KEY`: the value from the process's environment
    shell = b"sh\0-c\0exec vllm serve m --api-key $MY_KEY\0"
    assert apikey.server_key(shell, lambda: b"MY_KEY=expanded-1\0", None) == ("expanded-1", "--api-key")
    # what the restart settings start it with (for a server that dies before /proc is read)
    restart = {"argv": ["vllm", "serve", "m", "--api-key=" + KEY], "env": {"VLLM_API_KEY": "env-1"}}
    assert apikey.start_keys(restart, "VLLM_API_KEY") == [KEY, "env-1"] and apikey.start_keys(restart) == [KEY]


def test_an_unreadable_proc_is_said_in_the_401_text_and_no_key_is_sent():
    def read(path):
        if path.endswith("environ"):
            raise PermissionError(13, "Permission denied", path)
        return b"vllm\0serve\0m\0"

    found = apikey.read_server_key(4242, "VLLM_API_KEY", read=read)
    assert found.key is None and found.headers() == {}
    text = apikey.refused_text(401, found, "VLLM_API_KEY")
    assert text.startswith("the server answered 401: it was started with an API key that the agent could not "
                           "read from /proc/4242 (environ: Permission denied); run fleetpatch as root")
    assert apikey.refused_text(200, found) is None
    gone = apikey.read_server_key(2 ** 22 + 7, "VLLM_API_KEY")   # no such process
    assert gone.key is None and "No such file" in gone.unreadable


@pytest.fixture
def keyed_process():
    """A real process started the way a server with a key is: the flag on its command line, the
    variable in its environment."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--api-key", KEY, "--port", "1"],
                            env={**os.environ, "VLLM_API_KEY": "env-" + KEY, "VLLM_USE_V1": "1"})
    try:
        # just after the exec its /proc/PID/cmdline may read empty a moment (read_server_key says so)
        deadline = time.monotonic() + 30
        while KEY.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_running_servers_key_is_read_from_proc_and_its_launch_leaves_the_host_masked(keyed_process):
    found = apikey.read_server_key(keyed_process, "VLLM_API_KEY")
    assert (found.key, found.source, found.unreadable) == (KEY, "--api-key", None)
    assert found.headers() == {"Authorization": "Bearer " + KEY}
    launch = proc_launch(keyed_process, ("VLLM_",))
    assert launch["argv"][-3:] == ["***", "--port", "1"] and launch["env"]["VLLM_API_KEY"] == "***"
    assert launch["env"]["VLLM_USE_V1"] == "1"          # what routes the engine is still there
    assert KEY not in json.dumps(launch)


def test_the_session_masks_a_key_it_read_in_every_line_it_writes(keyed_process):
    out = io.StringIO()
    state = AgentState(out=out)
    apikey.known_key(state, keyed_process, "VLLM_API_KEY")
    state.emit({"t": "lines", "lines": ["server_args=ServerArgs(api_key='%s', port=1)" % KEY]})
    state.emit({"t": "result", "ok": False, "message": "failed with %s" % KEY})
    text = out.getvalue()
    assert KEY not in text and text.count("***") == 2
    assert "api_key='***'" in text
    # a key that is one of the protocol's own words leaves the line one the laptop reads
    state.secrets.add("result")
    out.seek(0)
    out.truncate()
    state.emit({"t": "result", "ok": True, "result": {"message": "the result"}})
    reply = json.loads(out.getvalue().split(" ", 1)[1])
    assert reply == {"t": "result", "ok": True, "result": {"message": "the ***"}}


class Vllm033(http.server.BaseHTTPRequestHandler):
    """/v1/models and /v1/completions behind vLLM 0.33.0's check, the key on the command line."""

    check = ApiKeyCheck((0, 33, 0), KEY, None)
    seen = []

    def log_message(self, *a):
        pass

    def answer(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.seen.append((self.path, self.headers.get("Authorization")))
        hit = self.check.refusal("GET", self.path, self.headers.get("Authorization"))
        self.answer(*(hit or (200, b'{"data": [{"id": "m"}]}')))

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, self.headers.get("Authorization")))
        hit = self.check.refusal("POST", self.path, self.headers.get("Authorization"))
        self.answer(*(hit or (200, b'{"choices": [{"text": " Paris"}]}')))


@pytest.fixture
def vllm_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Vllm033)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    Vllm033.seen = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def smoke_spec(url: str) -> dict:
    shaped = get_profile("vllm").smoke_request("The capital of France is", 4)
    return protocol.SmokeSpec(url=url, requests=1, concurrency=1, timeout=10, **shaped)


def smoke(spec: dict, found: apikey.ServerKey) -> dict:
    requests = SmokeRequests(spec, lambda: found, "VLLM_API_KEY")
    requests.start()
    requests.thread.join(20)
    return requests.event()


def test_the_smoke_requests_carry_the_key_that_was_read(vllm_server):
    spec = smoke_spec(vllm_server)
    event = smoke(spec, apikey.ServerKey(KEY, 4242, "--api-key"))
    assert event["statuses"] == [200] and "auth" not in event
    assert smoke_failure(event, spec) is None
    assert Vllm033.seen == [("/v1/models", "Bearer " + KEY), ("/v1/completions", "Bearer " + KEY)]


def test_the_end_of_the_smoke_requests_wakes_a_select_and_their_event_is_ready_then(vllm_server):
    """The follow waits on `end_fd` beside the log: once it is readable the event is there to send
    (not a moment later, when the thread has also finished); told, the follow stops waiting on it."""
    requests = SmokeRequests(smoke_spec(vllm_server), lambda: apikey.ServerKey(KEY, 4242, "--api-key"), "VLLM_API_KEY")
    requests.start()
    try:
        assert select.select([requests.end_fd], [], [], 20)[0] == [requests.end_fd]
        event = requests.event()
        assert event is not None and event["statuses"] == [200]
        assert requests.told and requests.event() is None
    finally:
        requests.thread.join(20)
        requests.close()
    assert requests.end_fd is None


def test_a_401_when_the_key_could_not_be_read_says_so_and_what_to_do(vllm_server):
    spec = smoke_spec(vllm_server)
    event = smoke(spec, apikey.ServerKey(pid=4242, unreadable="environ: Permission denied"))
    assert event["statuses"] == [401]
    why = smoke_failure(event, spec)
    assert why.startswith(f"1 of 1 smoke request to {vllm_server}/v1/completions failed; the first: HTTP 401")
    assert ("the server answered 401: it was started with an API key that the agent could not read from "
            "/proc/4242 (environ: Permission denied)") in why
    assert "run fleetpatch as root" in why
    assert Vllm033.seen == [("/v1/models", None)]      # refused at the model's name: nothing more was sent


# A container's main process is the OCI runtime's init (`runc init`) for a moment after `start`
# returned, then execs the server: stood in for by a process named `runc` that execs a keyed
# command when told to (a line on its stdin); the key is nowhere in its command line before.
BECOMES_THE_SERVER = ("import os, sys; sys.stdin.readline(); python = os.environ.pop('THE_PYTHON'); "
                      "os.execv(python, [python, '-c', 'import time; time.sleep(60)', "
                      "'--api-key', os.environ.pop('THE_KEY')])")


@pytest.fixture
def runtime_init(tmp_path):
    proc = subprocess.Popen(["runc", "-c", BECOMES_THE_SERVER], executable=sys.executable, stdin=subprocess.PIPE,
                            env={**os.environ, "THE_KEY": KEY, "THE_PYTHON": sys.executable})
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"runc\0") \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def exec_now(proc) -> None:
    proc.stdin.write(b"go\n")
    proc.stdin.flush()


def test_the_follow_reads_the_key_again_until_the_process_it_watches_has_become_the_server(runtime_init, tmp_path):
    with follow_of(tmp_path / "server.log", pid=runtime_init.pid) as follow:
        before = follow.server_key()
        assert (before.key, before.unreadable) == (None, None), "the runtime's init names no key"
        exec_now(runtime_init)
        deadline = time.monotonic() + 30
        while follow.server_key().key is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (follow.server_key().key, follow.server_key().source) == (KEY, "--api-key")
        assert KEY in follow.state.secrets, "from here on no line the session writes carries it"


def test_a_restarted_container_is_followed_once_its_process_has_left_the_runtime(runtime_init):
    from fleetpatch.agent.container import past_runtime_init
    assert past_runtime_init(runtime_init.pid, within=0.2) is False, "still `runc`: the wait ends at its bound"
    threading.Timer(0.2, exec_now, (runtime_init,)).start()
    assert past_runtime_init(runtime_init.pid, within=30) is True
    argv = Path(f"/proc/{runtime_init.pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0] == sys.executable.encode() and KEY.encode() in argv
