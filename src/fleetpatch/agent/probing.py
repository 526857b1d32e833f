"""The probe's life on the host: in just before fleetpatch restarts the server, out
once the verdict is in, its records read by the follow.

The probe dir is ``<state dir>/probe`` (plan, runtime, records); `INSTALLED`
in the state dir says which site directory holds this run's ``.pth``, so that a run
that died with its probe in (a killed laptop, a killed agent) is cleaned up by
the next run's probe/lock step (`remove_stale`). Records stay until the next
restart that fleetpatch does: `verify-logs` judges by them. On a container host
both the site dir and the probe dir are the container's (container_probe.py).
"""
import hashlib
import json
import marshal
import os
import subprocess
import sys

from . import container_probe, procs
from .base import atomic_write, ensure_dir, protocol, read_bytes, read_json, state_path
from .procs import proc_stat

if __name__.split(".")[0] == "fleetpatch":   # imported on the laptop (tests)
    from ..probe import install as probe_install
else:                                        # on a host: agentboot loaded it from stdin, before this
    probe_install = sys.modules[protocol.PROBE_MODULE_NAME]

PROBE_DIR = "probe"


def probe_dir(req):
    """This server's probe dir: `probe`, or `probe-<name>` for one of several servers on the host
    (each keeps its own window's records until its own next restart); on a container host the
    one inside the container, as a host path now (None: its root cannot be reached)."""
    if req.get("container"):
        return container_probe.host_dir(req)
    name = req.get("server_name") if req.get("server_names") else None
    return state_path(req, PROBE_DIR + ("-" + name if name else ""))
INSTALLED = "probe-installed.json"
SITE_QUERY_TIMEOUT_S = 60
RECORD_BYTES = 1 << 20   # what one follow event carries at most


SITE_CACHE = "probe-site-cache.json"
SITE_CACHE_MOST = 16


def site_key(python, env):
    """What SITE_QUERY's answer depends on: the interpreter's file, its venv's pyvenv.cfg (beside it
    or a level up) and the environment that steers `site` (PYTHON*, HOME for the user site)."""
    real = os.path.realpath(python)
    files = [python, real] + [os.path.join(d, "pyvenv.cfg") for d in (os.path.dirname(python),
                                                                     os.path.dirname(os.path.dirname(python)))]
    stats = []
    for path in files:
        try:
            st = os.stat(path)
            stats.append([path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            stats.append([path, None])
    steer = sorted((k, v) for k, v in env.items() if k.startswith("PYTHON") or k == "HOME")
    return hashlib.sha256(json.dumps([stats, steer]).encode("utf-8", "surrogateescape")).hexdigest()


def still_holds(info):
    """A cached answer names the same site dir today: it is still a directory, and no site dir
    before it in site.getsitepackages() has been created since (site reads only those that exist)."""
    try:
        chosen = probe_install.site_dir_from(info)
    except probe_install.ProbeInstallError:
        return False
    earlier = (info.get("site_packages") or [])
    earlier = earlier[:earlier.index(chosen)] if chosen in earlier else earlier
    return os.path.isdir(chosen) and not any(p not in (info.get("path") or []) and os.path.isdir(p) for p in earlier)


def cached_site_info(req, python, env):
    """site_info, its answer kept in the state dir under site_key: asking the interpreter starts
    it with every .pth of the host (40-50 ms of CPU on the test hosts, more on a real engine's),
    at every deploy, for an answer that changes only with the interpreter or its environment."""
    path = state_path(req, SITE_CACHE)
    cache = read_json(path)
    cache = cache if isinstance(cache, dict) else {}
    key = site_key(python, env)
    info = cache.get(key)
    if isinstance(info, dict) and "stamp" in info and still_holds(info):   # an answer without the build: asked again
        return info
    info = site_info(python, env)
    cache = dict(list((k, v) for k, v in cache.items() if k != key)[-(SITE_CACHE_MOST - 1):], **{key: info})
    try:
        atomic_write(path, json.dumps(cache).encode("utf-8", "surrogateescape"))
    except OSError:   # a cache that cannot be written costs the next run the query, nothing else
        pass
    return info


def site_info(python, env):
    """What SITE_QUERY says of `python` (the interpreter the server runs), or raises ProbeInstallError.

    The interpreter starts as the server's does, with the host's .pth files, and those may
    write anything to stdout (one test floods 200 MB): stdout goes nowhere, the answer comes
    in a file, and only the tail of stderr is kept for the error."""
    import tempfile   # here: the site query runs once per interpreter (cached); tempfile brings random and shutil
    with tempfile.TemporaryDirectory(prefix="fleetpatch-site-") as folder:
        answer, errors = os.path.join(folder, "answer.json"), os.path.join(folder, "stderr")
        try:
            with open(errors, "wb") as err:
                proc = subprocess.run([python, "-c", probe_install.SITE_QUERY, answer], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=err, env=env, timeout=SITE_QUERY_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise probe_install.ProbeInstallError("cannot run %s to find its site directory: %s" % (python, e))
        if proc.returncode != 0:
            raise probe_install.ProbeInstallError("%s failed to say its site directory (exit %d): %s" % (
                python, proc.returncode, tail(errors, 300)))
        try:
            return json.loads(read_bytes(answer).decode("utf-8", "replace"))
        except (IOError, OSError, ValueError):
            raise probe_install.ProbeInstallError("%s said no site directory" % python)


def tail(path, size):
    """The last `size` bytes of a file, as text."""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - size))
        return f.read().decode("utf-8", "replace").strip()


def server_env(req):
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("SSH_"))
    env.update((req.get("restart") or {}).get("env") or {})
    return env


def remove_stale(req, keep_token=None):
    """Take out every probe .pth that INSTALLED names and that is not `keep_token`'s; [] if none."""
    note = read_json(state_path(req, INSTALLED)) or {}
    if not note.get("site_dir"):
        return []
    return remove_from(req, note, lambda site: [probe_install.token_of(n)
                                                for n in probe_install.stale_probes(site, keep_token)])


def remove_from(req, note, tokens):
    """Remove the probe .pth of each token that `tokens(host site dir)` names from the site dir
    that `note` names; the paths removed, as the server sees them."""
    site = note["site_dir"]
    host_site = container_probe.site_on_host(req, note) if note.get("container") else site
    if host_site is None:   # a container that is not running now: the next run's lock removes it
        return []
    removed = []
    for token in tokens(host_site):
        removed += probe_install.remove(host_site, token)
    return [os.path.join(site, n) for n in removed]


def clear_records(req):
    """The last restart's records and plan go: a restart starts a new window."""
    if req.get("container"):
        container_probe.clear_records(req)
        return
    folder = probe_dir(req)
    if os.path.isdir(folder) and not os.path.islink(folder):
        import shutil   # here: shutil brings bz2 and lzma, a cost at every agent start that only this needs
        shutil.rmtree(folder, ignore_errors=True)


def install_probe(state, req):
    """Just before a restart: clear the last window's records, remove a stale probe, and put
    this run's in when the request asks for it. Never fails the restart: a probe that cannot
    go in is reported (the verdict then says the probe was unavailable, and why)."""
    spec = req.get("probe")
    out = {"stale_removed": remove_stale(req, None)}
    clear_records(req)
    if not spec:
        return dict(out, installed=False)
    python = spec.get("python") or sys.executable
    try:
        note, site, folder, seen, version, stamp = placement(req, spec, python)
        plan = dict(spec["plan"], python=python, python_version=version)
        source = protocol.unpack(spec["runtime"])
        server_code = None
        if seen is None:    # a container's interpreter is not run from here
            other = bool(stamp) and stamp.encode("utf-8") != probe_install.code_stamp()
            server_code = runtime_code_for(req, python, source, os.path.join(folder, probe_install.RUNTIME_NAME), other)
        atomic_write(state_path(req, INSTALLED), json.dumps(note).encode())
        done = probe_install.install(site, folder, spec["token"], plan, source=source, probe_dir_seen=seen,
                                     server_code=server_code, cache_dir=state_path(req, PLAN_CACHE))
    except (probe_install.ProbeInstallError, OSError, KeyError, ValueError) as e:
        return dict(out, installed=False, error=str(e))
    state.probe = dict(note, state_dir=req.get("state_dir"))
    return dict(out, installed=True, site_dir=note["site_dir"], pth=os.path.join(note["site_dir"],
                os.path.basename(done["pth"])), python=python, python_version=version)


def placement(req, spec, python):
    """Where the probe goes: (the INSTALLED note, the site dir and the probe dir as this host
    reaches them, the probe dir as the server sees it (None: the same), the interpreter's version)."""
    if req.get("container"):
        note, site, folder = container_probe.placement(req, spec["token"])
        return note, site, folder, container_probe.PROBE_DIR, container_probe.version_of(note["site_dir"]), None
    info = cached_site_info(req, python, server_env(req))
    site = probe_install.site_dir_from(info)
    folder = probe_dir(req)
    ensure_dir(os.path.dirname(folder))
    version = ".".join(str(n) for n in info.get("version") or [])
    return {"site_dir": site, "token": spec["token"]}, site, folder, None, version, info.get("stamp")


RUNTIME_CODES = "probe-code"
# install's per-file work (the watched modules rewritten and compiled, the sibling's names), kept
# between deploys keyed by the files' bytes, the lines and the build: a file already seen costs a read
PLAN_CACHE = "probe-plans"
RUNTIME_CODES_MOST = 8


def runtime_code_for(req, python, source, runtime_path, other_build):
    """The runtime compiled for the server's build, kept in the state dir per interpreter, runtime
    and path: compiled here (4 ms at every deploy before), or, for a build other than the agent's
    (`other_build`), by the server's interpreter: each server start then loads it instead of
    compiling the source (4-8 ms a start on 3.13), for one interpreter start here per fleetpatch
    version. None where it cannot be had (the start compiles the source, as before)."""
    key = hashlib.sha256(json.dumps([site_key(python, server_env(req)), runtime_path]).encode(
        "utf-8", "surrogateescape") + b"\0" + source).hexdigest()[:40]
    folder = state_path(req, RUNTIME_CODES)
    path = os.path.join(folder, key)
    try:
        return read_bytes(path)
    except (IOError, OSError):
        pass
    if other_build:
        code = probe_install.compiled_by([python], source, runtime_path)
    else:
        code = probe_install.code_stamp() + b"\0" + marshal.dumps(compile(source, runtime_path, "exec"))
    if code is not None:
        try:
            ensure_dir(folder)
            atomic_write(path, code)
            kept = sorted(os.listdir(folder), key=lambda n: os.stat(os.path.join(folder, n)).st_mtime_ns)
            for name in kept[:-RUNTIME_CODES_MOST]:
                os.unlink(os.path.join(folder, name))
        except OSError:     # not kept: the next deploy asks again
            pass
    return code


def op_probe_off(state, req):
    """The verdict is in: take this run's probe out (the records stay)."""
    return {"removed": remove_own(state, req)}


def remove_own(state, req=None):
    """This run's probe out of the site dir it went into. `req`: the request asking (else the
    session's end): on a container host, the container's root is the one of this moment."""
    held, state.probe = state.probe, None
    if not held:
        return []
    try:
        return remove_from(req if req and req.get("container") else held, held, lambda site: [held["token"]])
    except OSError:
        return []


def children_of(pid):
    """The live descendants of `pid`: from each thread's /proc/<pid>/task/<tid>/children (Linux 3.5+),
    which reads the server's tree only, else from every process's /proc/<n>/stat. The scan read
    every process of the host at each probe event (470 on a 16-host test machine: about 3 ms of the
    agent's CPU a call, several calls a follow)."""
    found = children_listed(pid)
    return found if found is not None else children_scanned(pid)


def children_listed(pid):
    """children_of from the kernel's children lists; None where /proc has none for `pid` (an older
    kernel, or one built without them): the caller scans."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir("/proc/%d/task" % parent)
            kids = []
            for tid in tids:
                with open("/proc/%d/task/%s/children" % (parent, tid), "rb") as f:
                    kids += [int(n) for n in f.read().split()]
        except (IOError, OSError, ValueError):
            if parent == pid:
                return None
            continue    # a child that ended meanwhile: it has no descendants to list
        for child in kids:
            if child not in found:
                found.append(child)
                todo.append(child)
    return sorted(found)


def children_scanned(pid):
    """children_of from every process's /proc/<n>/stat."""
    parents = {}
    for name in os.listdir("/proc"):
        stat = proc_stat(name) if name.isdigit() else None
        if stat is not None:
            parents.setdefault(stat.ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return sorted(found)


class RecordReader(object):
    """The probe's records of the window, each sent once (a record file is written once)."""

    def __init__(self, req):
        self.folder = probe_dir(req)
        self.records_dir = os.path.join(self.folder, probe_install.RECORDS_NAME) if self.folder else None
        self.boxed = bool(req.get("container"))
        self.sent = set()
        self.plan_sent = False

    def plan(self):
        """The plan this run wrote, read as records are (no link followed: the server's side may write here)."""
        data = probe_install.read_regular(os.path.join(self.folder, probe_install.PLAN_NAME), 4 << 20) \
            if self.folder else None
        try:
            return json.loads(data.decode("utf-8")) if data is not None else None
        except ValueError:
            return None

    def event(self, pid):
        """A `probe` event with the records not sent yet, or None when nothing is new."""
        files = probe_install.read_records(self.folder) if self.folder else {}
        new = dict((k, v.decode("utf-8", "replace")) for k, v in files.items() if k not in self.sent)
        if not new and self.plan_sent:
            return None
        self.sent.update(new)
        ev = {"t": "probe", "records": new, "pid": pid}
        if not self.plan_sent:
            self.plan_sent = True
            ev["plan"] = self.plan()
        if pid:
            ev["children"] = children_of(pid)
            ev["interpreter"] = procs.started_interpreter(pid, "/proc/%d/root" % pid if self.boxed else "")
            if self.boxed:   # the records' pids are the container's: so are the server's here
                ev = container_probe.inside_view(ev, ev["children"])
        return ev
