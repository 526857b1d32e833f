"""The agent's request loop: one process serves every request of one command on
this host.

The laptop sends the requests as JSON lines on the same channel and ends with
`bye` (or closes it). Each request runs to its end whatever happens to the
channel meanwhile (a step is never cut half-way: a write is atomic, a restart
finishes), so a channel that closes mid-operation is seen only between
requests. Then the lock this session took is left so that the next run knows
what happened (`end_session`). Each answer is JSON lines on stdout, each
prefixed with REPLY_PREFIX, the last one a Result.
"""
import json
import os
import signal
import threading
import time
import types

from .container import attach
from .base import AgentError, atomic_write, cpu_s, now_iso, protocol, read_json, state_path
from .follow import Follow
from .lock import LOCK_BUSY, LOCK_LOST, read_lock, release_lock
from .ops import op_apply, op_probe, op_record, op_restart, op_rollback, op_stop, op_unlock
from .probing import op_probe_off, remove_own
from .procs import own_start
from .serving import op_bake, op_drain, op_smoke
from .state import MUTATING, AgentState, RequestReader

TICK_S = protocol.TICK_S
TICKING_OPS = protocol.TICKING_OPS


class Ticker(object):
    """While a request that restarts a server runs (a stop may wait out its grace), a
    thread says so every TICK_S: the laptop tells a host at work from a stalled
    connection by these lines (remote.STALL_S), not only by the request's whole bound."""

    def __init__(self, state, req):
        self.state, self.req, self.op, self.done = state, req, req.get("op"), threading.Event()
        self.thread = threading.Thread(target=self.run, name="fleetpatch-ticker")
        self.thread.daemon = True
        self.busy = None

    def run(self):
        started = time.monotonic()
        while not self.done.wait(TICK_S):
            self.state.emit({"t": "tick", "op": self.op, "elapsed": round(time.monotonic() - started, 3)})

    def __enter__(self):
        if self.op in TICKING_OPS and self.op != "follow":   # follow ticks by itself
            self.thread.start()
            self.mark_busy()
        return self

    def mark_busy(self):
        """Say beside the lock which process changes the host for its run: should this
        channel stall, a fresh one of the same run must not release the lock (nor a next
        run take it over) while this process still writes or restarts."""
        token = self.req.get("lock_token")
        if not token or not self.req.get("state_dir"):
            return
        note = {"token": token, "pid": os.getpid(), "start": own_start(), "op": self.op}
        try:
            atomic_write(state_path(self.req, LOCK_BUSY), json.dumps(note).encode())
            self.busy = note
        except (IOError, OSError):
            pass   # no note: the lock itself still guards the host against other runs

    def __exit__(self, *exc):
        self.done.set()
        if self.thread.ident is not None:
            self.thread.join()
        if self.busy is not None and read_json(state_path(self.req, LOCK_BUSY)) == self.busy:
            try:
                os.unlink(state_path(self.req, LOCK_BUSY))
            except OSError:
                pass
        return False


def op_follow(state, req):
    """Follow the restarted server until the laptop's decision, then run the requests
    it sent (its record, its release of the lock) while the follow is still the one in
    progress: the record asks it whether the log was cut."""
    follow = Follow(state, req)
    previous, state.following = state.following, follow
    try:
        out = follow.run()
        if "requests" in out:
            out["then"] = [run_request(state, r) for r in out.pop("requests")]
        out["timings"] = {"agent_cpu_s": cpu_s()}   # the agent's CPU by its last reply of a deploy
        return out
    finally:
        state.following = previous
        follow.close()


OPS = types.MappingProxyType({"probe": op_probe, "apply": op_apply, "restart": op_restart, "rollback": op_rollback,
                              "stop": op_stop, "record": op_record, "unlock": op_unlock, "follow": op_follow,
                              "drain": op_drain, "smoke": op_smoke, "bake": op_bake, "probe_off": op_probe_off})


def dispatch(state, req):
    """Run one request; an unknown op is the laptop's bug, said plainly."""
    op = OPS.get(req.get("op"))
    if op is None:
        raise AgentError("error", "unknown agent operation %r" % req.get("op"))
    req = attach(req)   # a container host: the container checked (nothing done yet) and its root found
    try:
        result = op(state, req)
    except AgentError as e:
        state.session.failed(req, e.code)
        raise
    except BaseException:
        state.session.failed(req, "error")
        raise
    state.session.done(req, result)
    return result


def run_request(state, req):
    """One request and then its chained requests (`then`), in order, in this process:
    the laptop chains what must follow a success, e.g. the release of its lock."""
    result = dispatch(state, req)
    if req.get("then"):
        result["then"] = [run_request(state, r) for r in req["then"]]
    return result


def after_restart(req, window):
    """A follow sent together with the request that restarts (`after_restart`) takes
    its log window from that restart, the request answered just before it."""
    if not (req.get("op") == "follow" and req.get("after_restart")):
        return req
    if window is None:
        raise AgentError("skipped", "not followed: the request before it started no server")
    return dict(req, **protocol.log_window(window))


def answer(state, req):
    """Run one request and emit its Result line, whatever happens."""
    session = state.session
    window, session.restart_window = session.restart_window, None
    try:
        req = after_restart(req, window)
        with Ticker(state, req):
            result = run_request(state, req)
        if req.get("op") in MUTATING and isinstance(result.get("restart"), dict):
            session.restart_window = result["restart"]
        if req.get("op") == "probe" and state.boot:
            result["agent"] = dict(state.boot)
        state.emit({"t": "result", "ok": True, "result": result})
    except AgentError as e:
        state.emit({"t": "result", "ok": False, "code": e.code, "message": e.message})
    except Exception as e:  # a bug or an OS error: report it, don't hang the laptop
        import traceback   # here, not at the top: it costs milliseconds at every agent start

        state.emit({"t": "result", "ok": False, "code": "error",
                    "message": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()})


def main(req):
    """Answer one request in a session of its own (test harnesses run a step this way)."""
    answer(AgentState(), req)


def end_session(state, how):
    """The channel ended (`how`) with this session's lock still held. Nothing changed
    in the engine's files or server: release it, the host is as the run found it.
    Something changed: keep it, with a note of what happened beside it (`lock-lost`,
    never a rewrite of the lock file, which a new session of the same run may be
    releasing at this moment), so that the next run refuses with that story until
    an operator looks (status) and breaks it."""
    session = state.session
    req, session.lock_req = session.lock_req, None
    if req is None:
        return
    held = read_lock(req)
    if not held or held.get("token") != req.get("lock_token"):
        return
    if not session.changed:
        release_lock(state, req)
        return
    state.renewal.stop()   # kept for an operator to look at: nobody renews it, so it reads as left by a dead run
    note = {"token": held["token"], "at": now_iso(), "how": how, "after": list(session.changed), "pid": os.getpid()}
    try:
        atomic_write(state_path(req, LOCK_LOST), json.dumps(note).encode())
    except (IOError, OSError):
        pass  # the lock stays held without the note, which is still the safe side


def serve(fd=0, boot=None):
    """Answer request lines until `bye` or the end of the channel, in one AgentState.
    `boot` is agentboot's note of how each module was loaded."""
    state = AgentState(boot=boot)
    # A hangup must not kill a step half-way; the reply writes then fail quietly.
    # (A handler, not SIG_IGN: an ignored signal would be inherited by the server we start.)
    signal.signal(signal.SIGHUP, lambda *a: setattr(state, "gone", True))
    state.requests = reader = RequestReader(fd)
    how = "the laptop closed the channel"
    while True:
        line = reader.poll(None)
        if line is None:
            break
        if not line.strip():
            continue
        try:
            req = json.loads(line.decode("utf-8"))
        except ValueError as e:
            state.emit({"t": "result", "ok": False, "code": "error", "message": "not a JSON request line: %s" % e})
            continue
        if isinstance(req, list):
            # A follow's decision that arrived after that follow had ended (at its deadline
            # the agent waits only so long): its request was answered, so this gets no reply;
            # the laptop sees no `then` in that answer and releases its lock by request.
            continue
        if not isinstance(req, dict):
            state.emit({"t": "result", "ok": False, "code": "error",
                        "message": "not a JSON request object: %r" % (req,)})
            continue
        if req.get("op") == "bye":
            how = "the laptop said bye"
            break
        answer(state, req)
    # the channel ended (bye, Ctrl-C, a killed laptop): this run's probe never outlives its session
    remove_own(state)
    end_session(state, how)
