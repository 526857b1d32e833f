"""The agent protocol: every request, reply and ledger record, defined once.

Imported by the laptop side (`steps`, `remote`) and by the host agent, which
receives this source together with its own, so a host needs nothing
installed. Stdlib only, Python 3.8+ (a test parses it with feature_version
(3, 8) and checks its imports).

Wire format: one agent process serves every request of one command on a
host. After its sources (see `agentboot`), it reads one JSON request per line
on stdin, answers each in turn, and stops at `{"op": "bye"}` or at the end of
stdin. It writes JSON lines on stdout, each prefixed with REPLY_PREFIX so that
whatever a login shell or a `.pth` file prints can never be mistaken for an
answer. The last line of one request's answer is a `Result`; the next request
is sent only after it (so replies never interleave). A request may chain
requests to run after it succeeds (`then`, e.g. the release of the lock after
an apply without restart). `follow` is the one op that reads a line while it
runs: the laptop's follow-up requests once it has its verdict (a JSON list of
requests, run in order; `[]` ends the follow with none). Both save a round trip.

The records are TypedDicts, so at run time they are the plain dicts that go
through `json`; a type checker sees a misspelt field on either side. On a host
(this module loaded by `agentboot` as AGENT_MODULE_NAME) no type checker runs:
there the records are built on a bare dict subclass, and the annotations stay
unevaluated strings, because importing `typing` and building its TypedDict
classes was about a tenth of the agent's CPU at every start.
"""
from __future__ import annotations

import binascii
import zlib

if __name__ == "fleetpatch_protocol":   # AGENT_MODULE_NAME, on a host
    class TypedDict(dict):
        """The records' base on a host: a dict, as json and the agent read it."""

        def __init_subclass__(cls, total=True, **kwargs):
            super().__init_subclass__(**kwargs)
else:
    from typing import Any, Dict, List, Optional, TypedDict  # noqa: F401  (annotations)

REPLY_PREFIX = "@@fleetpatch "
LEDGER_FILE = "ledger.json"
LOCK_FILE = "lock"
# The agent holding a lock touches its mtime every LOCK_RENEW_S (or the claim's renew_s);
# a lock not renewed for LOCK_STALE_PERIODS periods (3 missed renewals and a margin of 2)
# is left by a dead run. The judgement only changes what is said: --break-lock still clears it.
LOCK_RENEW_S = 5.0
LOCK_STALE_PERIODS = 5
LEDGER_VERSION = 1

# Name under which the agent finds this module when both are sent to a host.
AGENT_MODULE_NAME = "fleetpatch_protocol"
PROBE_MODULE_NAME = "fleetpatch_probe_install"   # probe/install.py on a host, loaded after the protocol
REDACT_MODULE_NAME = "fleetpatch_redact"         # redact.py on a host: what a secret is, as the laptop says


def pack(data):
    """File bytes for JSON: zlib then base64 (source text shrinks about 4x). binascii, not the
    base64 module, which imports struct and re-checks what binascii does: ~1 ms at every agent start.
    Level 1: the bench patch's two files (75 KB) in 0.6 ms of a host's CPU, 1.5 ms at level 6, for
    19.6 KB instead of 15.5 KB on the wire; the agent packs every file a probe reads, at every deploy."""
    return binascii.b2a_base64(zlib.compress(data, 1), newline=False).decode("ascii")


def unpack(text):
    return zlib.decompress(binascii.a2b_base64(text))


# ------------------------------------------------------------- requests

class RestartSettings(TypedDict, total=False):
    """The inventory's server.restart as the agent needs it (argv already split)."""
    kind: str                   # command | systemd | supervisor
    argv: List[str]             # command: the start command line, tokenised on the laptop
    env: Dict[str, str]
    workdir: Optional[str]
    pidfile: Optional[str]
    stop_grace: float
    unit: Optional[str]         # systemd
    program: Optional[str]      # supervisor
    config: Optional[str]       # supervisor: supervisord.conf


class LockClaim(TypedDict, total=False):
    token: str                  # this run's; the lock file holds it
    holder: str                 # "user@laptop pid N", shown to whoever finds the lock held
    force: bool                 # --break-lock: remove whatever lock is there first
    command: str                # what the run does here, e.g. "deploy-patch --patch NAME"
    laptop: str                 # the laptop's hostname, and its process (pid, start time in
    pid: int                    # clock ticks since boot): a run on the same laptop whose
    pid_start: Optional[int]    # process is gone is known dead at once
    boot_id: Optional[str]      # the laptop's boot: a same-named laptop is not this one
    renew_s: float              # how often the holding agent renews the lock


class Request(TypedDict, total=False):
    """What every request carries (`base_request` on the laptop)."""
    op: str
    state_dir: str
    package: str                # the engine's import name, e.g. "sglang"
    version_file: str           # the file in the package dir that states the version (`__version__ = "X"`):
                                # read where no dist-info says (the profile's; absent: none)
    launch_env_prefixes: List[str]  # which of the server's environment variables route the engine
    # the environment variable that gives the server its API key where no --api-key does (vLLM's
    # VLLM_API_KEY): the agent reads the key from the server's /proc and sends it; it never leaves the host
    api_key_env: str
    log: Optional[str]
    restart: Optional[RestartSettings]   # None: apply without a restart (--no-restart)
    health_url: Optional[str]
    lock_token: str             # a mutating op refuses unless this run holds the lock
    then: List["Request"]       # run after this one succeeds, in the same agent process
    container: "ContainerSpec"  # a container host: the engine's container (agent/container.py)
    # a host with several servers on one install (agent/ledger.py keeps each one's restarts)
    server_names: List[str]     # every server of the host
    server_name: Optional[str]  # the server this request restarts or judges (None: the install as a whole)
    servers_pending: List[str]  # apply/rollback: the servers that must restart to run the changed files


class ContainerSpec(TypedDict, total=False):
    name: str                   # engine.container: a name or an id
    runtime: str                # docker | podman
    python: str                 # engine.python, inside the container


class ProbeRequest(Request, total=False):
    files: List[str]            # relative to the package directory
    content: bool               # send the files' bytes (packed), not only their sha256
    lock: LockClaim             # take the lock before reading anything
    ledger_files: bool          # status: also describe every file the ledger names


# What a diff does to one file (`diffapply.FileDiff.op`), in the apply request and the ledger.
OP_MODIFY, OP_CREATE, OP_DELETE = "modify", "create", "delete"


class _ApplyFileRequired(TypedDict):
    path: str
    before: Optional[str]       # sha256 the file must have now; None (create): it must not exist
    after: Optional[str]        # sha256 of `content`; None (delete): the file is removed


class ApplyFile(_ApplyFileRequired, total=False):
    op: str                     # modify (the default, also when absent) | create | delete
    content: str                # packed new bytes; absent for delete


class ApplyRequest(Request, total=False):
    package_dir: str
    name: str                   # the patch
    rev: int
    label: str                  # "name@rev"
    diff_sha256: str
    files: List[ApplyFile]
    record: "PatchRecord"       # kept in the ledger entry: what verify-logs and rollback need of the patch


class RestartRequest(Request, total=False):
    reason: str


class RollbackRequest(Request, total=False):
    package_dir: str
    name: str
    force: bool                 # restore even over a file changed since fleetpatch wrote it
    restart_pending: bool       # the server never ran what is undone: its restart is pending after only as before


class FollowRequest(Request, total=False):
    inode: Optional[int]        # the log window: the log's inode and size just before the start
    offset: int
    pid: Optional[int]          # the server started by the restart
    timeout: float
    ready_line: str
    server_info_url: Optional[str]
    # True: the window is the restart's of the request answered just before this one
    # (the follow is sent with it, a round trip sooner); without one it is `skipped`
    after_restart: bool
    # the smoke requests to send once the server is ready (patch.yaml's `prove`); none: send none
    smoke: "SmokeSpec"


class SmokeSpec(TypedDict, total=False):
    url: str                # the server's base URL, as the host reaches it
    prompt: str
    max_new_tokens: int
    requests: int
    concurrency: int
    timeout: float          # per request
    # as the engine's profile shapes the request (absent: SGLang's POST /generate {text, sampling_params})
    path: str               # e.g. "/v1/completions"
    body: Dict[str, Any]    # the JSON body, prompt and max tokens in it
    answer: str             # how its text is read: "text" (a `text` field) | "choices" (choices[0].text)
    model_from: str         # the body needs the served model's name: GET this (e.g. "/v1/models") for it


class LedgerUpdate(TypedDict, total=False):
    verification: Dict[str, "Verification"]    # per patch name
    last_verification: "LastVerification"


class RecordRequest(Request, total=False):
    """Write a verification verdict into the ledger (follow-up of `follow`)."""
    ledger_update: LedgerUpdate
    lock: LockClaim   # a run that holds no lock (verify-logs): the write is done under the host's lock, taken here


# --------------------------------------------------------------- replies

class FileInfo(TypedDict, total=False):
    sha256: str
    size: int
    mode: int
    content: str                # packed, when asked for


class ServerState(TypedDict, total=False):
    pid: Optional[int]
    alive: bool
    healthy: bool
    argv: Optional[List[str]]   # from /proc, while it runs
    env: Optional[Dict[str, str]]


class LockLost(TypedDict, total=False):
    """state_dir/lock-lost: the holder's session ended, without releasing, after it changed the host."""
    token: str                  # the lock's (a note for another token is stale and ignored)
    at: str
    how: str                    # "the laptop closed the channel" | "the laptop said bye"
    after: List[str]            # the mutating ops the session ran: apply, restart, rollback
    pid: int                    # the agent process


class LockRecord(TypedDict, total=False):
    token: str
    holder: str
    since: str
    since_epoch: float
    command: str                # the claim's fields (LockClaim)
    laptop: str
    pid: int
    pid_start: Optional[int]
    boot_id: Optional[str]
    renew_s: float
    orphaned: LockLost          # read_lock adds it when lock-lost is this lock's
    idle_s: float               # read_lock: seconds since the last renewal, on the host's clock
    age_s: float                # read_lock: seconds since it was taken


class LogPosition(TypedDict):
    inode: Optional[int]
    offset: int


class ProbeReply(TypedDict, total=False):
    python: str
    python_version: str
    locked: bool
    package_dir: str
    version: Optional[str]
    files: Dict[str, Optional[FileInfo]]     # None: the file does not exist
    absent_folders: List[str]                # of the absent files, the folders that do not exist either
    ledger: "Ledger"
    lock: Optional[LockRecord]
    server: ServerState
    session_env: Dict[str, str]              # the engine's variables in the agent's SSH session: a command
                                             # restart's server inherits them, hosts.yaml's env over them
    log: LogPosition
    agent: Dict[str, str]                    # per module sent: "cached" (compile cache) | "compiled"
    recovered: Dict[str, object]             # what the rename journal of a dead run had left, and what was done
    window_intact: bool                      # the last restart's log window can still be read as it was
    timings: Dict[str, Optional[float]]      # agent_age_s (the agent's age as this request starts), probe_s,
                                             # agent_cpu_s (the agent's own CPU, user + system, at this reply)


class JournalWindow(TypedDict, total=False):
    unit: str
    invocation: Optional[str]
    since: float


class RestartReply(TypedDict, total=False):
    """What one restart did; `inode`/`offset` are the log window it opened."""
    kind: str
    pid: Optional[int]
    inode: Optional[int]
    offset: int
    stopped: Optional[int]      # command: the pid stopped (None: nothing ran)
    signal: str                 # command: TERM or KILL
    unit: str
    program: str
    journal: JournalWindow      # systemd unit logging to the journal
    start_error: str            # supervisor: what it said when the program died starting
    stop_s: float               # command, container: how long the stop took (the rest of the restart is the start)


class ApplyReply(TypedDict, total=False):
    written: List[str]          # files modified
    created: List[str]
    deleted: List[str]
    restart: RestartReply
    timings: Dict[str, float]   # write_s, restart_s (the probe's install, probe_install_s, done within it
                                # while the old server stops): where the request's time went; agent_cpu_s


class RollbackReply(TypedDict, total=False):
    restored: List[str]         # put back from their backups (modified or deleted by the patch)
    removed: List[str]          # created by the patch, removed with their bytecode
    files: Dict[str, Optional[FileInfo]]
    restart: RestartReply


class FollowReply(TypedDict, total=False):
    ended: str                  # finished | deadline | stdin closed (the laptop's channel ended)
    then: List[Dict[str, Any]]  # the results of the follow-up requests, in order
    timings: Dict[str, float]   # agent_cpu_s: the agent's own CPU (user + system) after the follow-ups


class Result(TypedDict, total=False):
    """The last line of every answer."""
    t: str                      # "result"
    ok: bool
    result: Dict[str, Any]
    code: str                   # when not ok: the host's status (locked, drift, ...)
    message: str
    traceback: str


# Events of `follow`, before its Result (the field `t` names the kind):
#   lines        {file, first_line_no, lines, bytes_read}  (line 1: the first since the restart; bytes_read:
#                of the log file, all this follow has read, None for the journal or a container's output)
#   state        {alive, healthy, elapsed}
#   server_info  {data}
#   launch       {pid, argv, env}
#   tick         {elapsed}  (also sent, with `op`, by the other TICKING_OPS while they run)
#   deadline     {}
FOLLOW_EVENTS = ("lines", "state", "server_info", "launch", "tick", "deadline")

# Requests that can run long (a stop waits out the server's grace) say every TICK_S
# that they still run, so the laptop tells a host at work from a stalled link.
TICK_S = 1.0
TICKING_OPS = ("apply", "restart", "stop", "rollback", "follow")


# ---------------------------------------------------------------- ledger

class _LedgerFileRequired(TypedDict):
    before: Optional[str]       # sha256 of the original; None: the patch created the file
    after: Optional[str]        # sha256 fleetpatch wrote; None: the patch deleted the file
    backup: Optional[str]       # the original's copy, relative to the state dir; None for a created file


class LedgerFile(_LedgerFileRequired, total=False):
    op: str                     # modify | create | delete (a ledger written before ops existed: modify)
    mode: int                   # delete: the removed file's permission bits, for rollback to restore
    uid: int                    # delete: its owner
    gid: int


class Verification(TypedDict):
    status: str
    executed_path: Optional[str]
    at: str


class PatchRecord(TypedDict, total=False):
    """A deployed patch as the host keeps it (fleetpatch.patchrecord): verify-logs and
    rollback judge by it, from any laptop, with or without the patch's folder."""
    manifest: Dict[str, Any]    # patch.yaml as data: name, engine, markers, expect, forbid, smoke_expect, executed, ...
    revision: Dict[str, Any]    # the revision deployed: rev, engine_versions, diff (its name), diff_sha256, files
    added: Dict[str, List[int]]  # the lines it adds, as numbered in the files written on this host
    stacked: Dict[str, Dict[str, List[int]]]  # label -> the lines of each patch below it, as its files number them


class LedgerEntry(TypedDict, total=False):
    rev: int
    label: str
    diff_sha256: str
    applied_at: str
    seq: int                    # order of application: later patches stack on earlier ones
    files: Dict[str, LedgerFile]
    verification: Optional[Verification]
    record: PatchRecord         # absent in an entry written by a fleetpatch older than the record


class LastRestart(TypedDict, total=False):
    at: str
    epoch: float
    log: Optional[str]
    inode: Optional[int]
    offset: int
    pid: Optional[int]
    reason: str
    journal: JournalWindow
    verified_size: int          # the log's size when its window was judged: a smaller log was cut since
    window_cut: bool            # the window was truncated or deleted while it was followed
    ready_epoch: float          # host clock: when the first follow after this restart saw the ready line
    verdict_epoch: float        # host clock: the first verdict recorded after this restart


class LastVerification(TypedDict, total=False):
    at: str
    status: str
    labels: List[str]
    check: str                  # deploy (markers seen) | rollback (markers gone) | verify-logs


class _RolledBackRequired(TypedDict):
    label: str
    at: str


class RolledBack(_RolledBackRequired, total=False):
    record: PatchRecord         # the rolled-back entry's: a pending restart's check needs its markers


class Ledger(TypedDict, total=False):
    """state_dir/ledger.json: what fleetpatch did to this host."""
    version: int
    patches: Dict[str, LedgerEntry]
    restart_pending: bool
    last_restart: Optional[LastRestart]
    last_verification: LastVerification
    rolled_back: Dict[str, RolledBack]


def empty_ledger():
    # type: () -> Ledger
    return Ledger(version=LEDGER_VERSION, patches={}, restart_pending=False, last_restart=None)


AFTER_RESTART = {"after_restart": True}   # a follow's start: the window of the restart sent just before it


def log_window(restart):
    # type: (RestartReply) -> dict
    """The follow window a restart opened (the same names as FollowRequest)."""
    return {"inode": restart.get("inode"), "offset": restart.get("offset", 0), "pid": restart.get("pid")}


def parse_worker_loads(body):
    """(running, waiting) requests from a worker's GET /v1/loads or the deprecated
    GET /get_load (one entry per DP rank; num_reqs counts running + waiting).
    Here because both the agent (the drain, on the host) and the laptop read it."""
    if isinstance(body, dict) and isinstance(body.get("aggregate"), dict):
        agg = body["aggregate"]
        running, waiting = agg.get("total_running_reqs"), agg.get("total_waiting_reqs")
        if isinstance(running, int) and isinstance(waiting, int):
            return running, waiting
        raise ValueError("aggregate lacks integer total_running_reqs/total_waiting_reqs")
    if isinstance(body, list) and all(isinstance(x, dict) for x in body):
        try:
            waiting = sum(int(x["num_waiting_reqs"]) for x in body)
            total = sum(int(x["num_reqs"]) for x in body)
        except (KeyError, TypeError, ValueError):
            raise ValueError("entries lack num_reqs/num_waiting_reqs") from None
        return total - waiting, waiting
    raise ValueError("expected /v1/loads' {'aggregate': ...} or /get_load's list")
