"""The operations that read and change the host: probe, apply, restart, rollback,
unlock, record. Each takes the session's AgentState and the request."""
import json
import os
import sys
import time

from . import inroot
from .apikey import known_key
from .base import (AgentError, atomic_write, cpu_s, ensure_dir, expand, file_meta, now_iso, protocol, read_bytes, sha256_bytes,
                   state_path, unpack)
from .files import (describe_file, digest, read_or_none, recover, safe_join, sibling_meta, write_with_ledger,
                    writable_join)
from .container import locate_package, patch_lost, rebase
from .http import http_get
from .ledger import load_ledger, save_ledger
from .lock import check_lock, read_lock, release_lock, take_lock
from .logs import LogFollower, find_inode
from .package import PACKAGE_CACHE, file_version, package_dir, package_version
from .probing import install_probe, remove_stale
from .procs import own_age, pid_alive, proc_launch, session_env
from .restart import log_position, restart_server, server_pid, stop_server


def op_probe(state, req):
    # timings: the agent's age as this request starts (its start: interpreter, stage two, modules)
    out = {"python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3],
           "host_time": time.time(),   # the host's clock: how long ago its last restart was (status)
           "timings": {"agent_age_s": own_age()}}
    started = time.monotonic()
    if req.get("lock"):
        out["locked"] = take_lock(state, req, req["lock"])
        if not out["locked"]:
            out["lock"] = read_lock(req)   # another run's: the laptop says whose, and whether it lives
            return out
        # a run that died mid-write (or left temp files) is finished before anything is read
        recovered = recover(req)
        if recovered:
            out["recovered"] = recovered
        # a probe left in by a run that died before taking it out: the next restart by anyone must not load it
        stale = remove_stale(req)
        if stale:
            out["stale_probe_removed"] = stale
    package = req["package"]
    if req.get("_container"):   # a container host: found in the container's site dirs, read from the host
        root, out["package_dir"], out["version"] = locate_package(req, package)
        if not out["version"]:   # no dist-info that says: the profile's version file, read inside the container
            croot = req["_container"]["root"]
            out["version"] = file_version(out["package_dir"], req.get("version_file"),
                                          read=lambda path: inroot.read(croot, path))
        out["container"] = dict((k, req["_container"][k]) for k in ("name", "id", "created", "started_at", "image"))
    else:
        root = package_dir(package, package_cache(req))
        out["package_dir"] = root
        out["version"] = package_version(package, root, req.get("version_file"))
    files = list(req.get("files") or [])
    ledger = load_ledger(req)
    if req.get("ledger_files"):  # status: every file fleetpatch wrote, to spot drift in this same trip
        for entry in ledger.get("patches", {}).values():
            files.extend(p for p in entry.get("files", {}) if p not in files)
    jail = (req.get("_container") or {}).get("root")
    out["files"] = dict((rel, describe_file(root, rel, req.get("content", False), jail)) for rel in files)
    # an absent file that a diff creates needs its folder: say which folders are missing
    out["absent_folders"] = sorted(set(os.path.dirname(rel) for rel in files if out["files"][rel] is None
                                       and not os.path.isdir(os.path.dirname(safe_join(root, rel)))))
    out["ledger"] = ledger
    if req.get("_container") and patch_lost(ledger, req["_container"]):
        out["patch_lost"] = patch_lost(ledger, req["_container"])
    out["lock"] = read_lock(req)
    restart = req.get("restart")
    if restart:
        pid = server_pid(dict(restart, state_dir=req.get("state_dir"), server=req.get("server_name")))
        alive = pid_alive(pid)
        out["server"] = {"pid": pid, "alive": alive}
        out["session_env"] = session_env(req.get("launch_env_prefixes") or ())
        if alive:
            out["server"].update(proc_launch(pid, req.get("launch_env_prefixes") or ()))
        if req.get("health_url") and alive:
            found = known_key(state, pid, req.get("api_key_env"))   # for a health_url that wants it
            status, _ = http_get(req["health_url"], timeout=3.0, headers=found.headers())
            out["server"]["healthy"] = status == 200
    if req.get("log"):
        out["log"] = log_position(req["log"])
        out["window_intact"] = window_intact(req["log"], ledger.get("last_restart"))
    out["timings"]["probe_s"] = round(time.monotonic() - started, 4)
    out["timings"]["agent_cpu_s"] = cpu_s()
    return out


def package_cache(req):
    """The state dir's cache of where the package is, or None (no state dir given, or one
    that is refused: then the probe's own reads of it say why)."""
    if not req.get("state_dir"):
        return None
    try:
        return state_path(req, PACKAGE_CACHE)
    except AgentError:
        return None


def window_intact(log, last):
    """Does the log still hold what the server wrote since fleetpatch's last restart? Not
    when the file was truncated below the window's start, or rotated or deleted away."""
    if not last or last.get("inode") is None or last.get("log") not in (None, log):
        return None
    if last.get("window_cut"):
        return False
    st = LogFollower._stat(expand(log))
    if st is not None and st.st_ino == last["inode"]:
        return st.st_size >= max(last.get("offset", 0), last.get("verified_size", 0))
    return find_inode(expand(log), last["inode"]) is not None


def planned_change(root, label, f):
    """One file of an apply request, checked against the host as it is now: what to
    write (`data`; None: delete), what to put back on failure (`original`; None: create)."""
    op = f.get("op") or protocol.OP_MODIFY
    rel = f["path"]
    path = writable_join(root, rel)
    if op == protocol.OP_CREATE:
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            raise AgentError("conflict", "the patch creates %s, but its folder %s does not exist on this host; "
                             "nothing was written; the patch was made for another layout of the package" % (rel, folder))
        if os.path.lexists(path):
            raise AgentError("conflict", "the patch creates %s, but it exists now (it did not when fleetpatch read the "
                             "host: something created it meanwhile); nothing was written; inspect it, then rerun"
                             % rel)
        original, meta = None, sibling_meta(folder, os.path.basename(path))
    else:
        original = read_or_none(path)
        if original is None:
            raise AgentError("drift", "%s was removed on the host while fleetpatch was working; nothing was written; "
                             "rerun" % rel)
        if sha256_bytes(original) != f["before"]:
            raise AgentError("drift", "%s changed on the host while fleetpatch was working (sha256 %s, expected %s); "
                             "nothing was written; rerun" % (rel, sha256_bytes(original)[:12], f["before"][:12]))
        meta = file_meta(path)
    data = None
    if op != protocol.OP_DELETE:
        data = unpack(f["content"])
        if sha256_bytes(data) != f["after"]:
            raise AgentError("error", "the new content of %s was damaged in transit; nothing was written" % rel)
    return {"path": rel, "op": op, "data": data, "original": original, "backup": original, "meta": meta,
            "source": os.path.join("backups", label, rel) if original is not None else None}


def op_apply(state, req):
    """Back up, write every file, record the ledger, and restart — one round trip."""
    started = time.monotonic()
    check_lock(req)
    root = req["package_dir"]
    ledger = load_ledger(req)
    if req.get("_container"):   # a re-created container lost what the ledger recorded for the old one
        rebase(ledger, req["_container"])
    label = req["label"]
    state_path(req, "backups", label)   # refuses a symlink in the state dir before anything is read
    # Every file is checked before anything is written: a refusal leaves the host as it was.
    changes = [planned_change(root, label, f) for f in req["files"]]
    # Backups first, and durable, so the originals survive whatever follows (a deleted
    # file's too: its mode and owner go into the ledger).
    for ch in changes:
        if ch["original"] is None:
            continue   # created: there is nothing to keep, and rollback removes it
        dest = state_path(req, ch["source"])
        if os.path.exists(dest) and sha256_bytes(read_bytes(dest)) == sha256_bytes(ch["original"]):
            continue
        try:
            ensure_dir(os.path.dirname(dest))
            atomic_write(dest, ch["original"], like=None)
        except OSError as e:
            raise AgentError("error", "cannot back up %s to %s (%s); no engine file was changed; free space "
                             "or fix the permissions of the state dir, then rerun" % (ch["path"], dest, e))
    previous = json.loads(json.dumps(ledger))
    ledger["restart_pending"] = True
    seq = 1 + max([e.get("seq", 0) for e in ledger.get("patches", {}).values()] or [0])
    files = {}
    for ch in changes:
        rec = protocol.LedgerFile(op=ch["op"], before=digest(ch["original"]), after=digest(ch["data"]),
                                  backup=ch["source"])
        if ch["op"] == protocol.OP_DELETE:
            rec.update(ch["meta"])   # mode, uid, gid: rollback puts the file back as it was
        files[ch["path"]] = rec
    entry = protocol.LedgerEntry(rev=req["rev"], label=label, diff_sha256=req["diff_sha256"], applied_at=now_iso(),
                                 seq=seq, files=files, verification=None)
    if req.get("record"):   # what verify-logs and rollback judge by, from any laptop
        entry["record"] = req["record"]
    ledger.setdefault("patches", {})[req["name"]] = entry
    # The ledger says "restart pending" before any engine file changes: a run that
    # dies between the write and the restart is finished by the next run.
    save_ledger(req, ledger)
    write_with_ledger(req, root, changes, previous, ledger, backups=True)
    out = {"written": [c["path"] for c in changes if c["op"] == protocol.OP_MODIFY],
           "created": [c["path"] for c in changes if c["op"] == protocol.OP_CREATE],
           "deleted": [c["path"] for c in changes if c["op"] == protocol.OP_DELETE]}
    # where the request's time went on the host (the report's apply_timings; bench/README.md)
    marks = [("write_s", time.monotonic())]
    probe_s = None
    if req.get("restart"):
        out["restart"], out["probe"], probe_s = restart_with_probe(state, req, ledger, "deploy " + label)
        save_ledger(req, ledger)
        marks.append(("restart_s", time.monotonic()))
    out["timings"] = dict((name, round(t - (marks[i - 1][1] if i else started), 4)) for i, (name, t) in enumerate(marks))
    if probe_s is not None:   # within restart_s: done while the old server stopped
        out["timings"]["probe_install_s"] = round(probe_s, 4)
    out["timings"]["agent_cpu_s"] = cpu_s()
    return out


def restart_with_probe(state, req, ledger, reason):
    """(the restart's result, the probe's install's, the seconds that took): the restart, with
    the probe put in (or left out, as the request says) while the old server stops."""
    done = {}

    def put_probe():
        began = time.monotonic()
        try:
            done["probe"] = install_probe(state, req)
        except Exception as e:   # the old server has its TERM: the restart goes on, the probe reported off
            done["probe"] = {"installed": False, "error": "the probe could not go in: %s" % e}
        done["seconds"] = time.monotonic() - began

    restart = restart_server(req, ledger, reason, meanwhile=put_probe)
    return restart, done.get("probe"), done.get("seconds")


def op_restart(state, req):
    check_lock(req)
    ledger = load_ledger(req)
    restart, probe, _ = restart_with_probe(state, req, ledger, req.get("reason", "restart"))
    out = {"restart": restart, "probe": probe}
    save_ledger(req, ledger)
    return out


def op_stop(state, req):
    """Stop the server, its restart left pending (the ranks of a multi-node server: all stop, then all start)."""
    check_lock(req)
    ledger = load_ledger(req)
    out = {"stop": stop_server(req, ledger)}
    save_ledger(req, ledger)
    return out


def rollback_change(req, root, entry, rel, rec):
    """What restoring one file of a ledger entry takes (None: it holds its original already).
    A modified file gets its backup back; a created one is removed (its bytecode with it); a
    deleted one is put back from its backup with its mode and owner, only where it is absent.
    Each only from what fleetpatch wrote: anything else is drift, unless --force."""
    op = rec.get("op") or protocol.OP_MODIFY
    path = writable_join(root, rel)
    current = read_or_none(path)
    backup = None
    if rec.get("backup"):
        backup = read_or_none(state_path(req, rec["backup"]))
        if digest(backup) != rec["before"]:
            raise AgentError("error", "the backup of %s (%s) is %s, not the original's recorded sha256 %s; nothing "
                             "was restored" % (rel, state_path(req, rec["backup"]),
                                               "missing" if backup is None else "damaged", rec["before"][:12]))
    cur_sha = digest(current)
    if cur_sha == rec["before"]:
        return None
    if cur_sha != rec["after"] and not req.get("force"):
        if op == protocol.OP_CREATE:
            why = ("%s, which %s created, changed since fleetpatch wrote it (sha256 %s, wrote %s); nothing was "
                   "restored; inspect it, then rerun with --force to remove it anyway"
                   % (rel, entry["label"], cur_sha[:12], rec["after"][:12]))
        elif op == protocol.OP_DELETE:
            why = ("%s, which %s deleted, exists again with other content (sha256 %s); nothing was restored; "
                   "inspect it, then rerun with --force to put the original back over it"
                   % (rel, entry["label"], cur_sha[:12]))
        elif current is None:
            why = ("%s was removed since fleetpatch wrote it; nothing was restored; rerun with --force to put the "
                   "original back" % rel)
        else:
            why = ("%s changed since fleetpatch wrote it (sha256 %s, wrote %s); nothing was restored; inspect it, "
                   "then rerun with --force to restore the original anyway" % (rel, cur_sha[:12], rec["after"][:12]))
        raise AgentError("drift", why)
    if op == protocol.OP_DELETE:
        # the deleted file's own mode and owner, from the ledger, even over a file made since
        meta = dict((k, rec[k]) for k in ("mode", "uid", "gid") if k in rec)
        meta = meta if len(meta) == 3 else sibling_meta(os.path.dirname(path), os.path.basename(path))
    elif current is not None:
        meta = file_meta(path)
    else:
        meta = sibling_meta(os.path.dirname(path), os.path.basename(path))
    return {"path": rel, "op": "remove" if backup is None else "restore", "data": backup, "original": current,
            "backup": backup, "source": rec.get("backup"), "meta": meta, "own_meta": op == protocol.OP_DELETE}


def op_rollback(state, req):
    """Restore the originals of one patch (sha256-checked) and restart."""
    check_lock(req)
    root = req["package_dir"]
    ledger = load_ledger(req)
    entry = ledger.get("patches", {}).get(req["name"])
    if not entry:
        raise AgentError("error", "%s is not recorded as applied on this host; nothing to roll back" % req["name"])
    # Patches stack: in a shared file a newer patch's lines sit on this one's, and the
    # backup holds neither. Restoring it, even with --force, would take the newer patch's
    # lines out while its record stays (and a later rollback of it would put this one's
    # lines back unrecorded). So the newest goes first, always.
    shared, newer = set(), []
    for other, e in sorted(ledger.get("patches", {}).items()):
        overlap = set(e.get("files", {})) & set(entry["files"])
        if other != req["name"] and e.get("seq", 0) > entry.get("seq", 0) and overlap:
            newer.append(other)
            shared |= overlap
    if newer:
        raise AgentError("error", "%s was applied after %s and changes the same files (%s); nothing was restored; "
                         "roll back %s first, or roll back everything (rollback without --patch goes newest first)"
                         % (", ".join(newer), entry["label"], ", ".join(sorted(shared)), " and ".join(newer)))
    changes = [c for c in (rollback_change(req, root, entry, rel, rec) for rel, rec in sorted(entry["files"].items()))
               if c is not None]
    previous = json.loads(json.dumps(ledger))
    del ledger["patches"][req["name"]]
    rolled = protocol.RolledBack(label=entry["label"], at=now_iso())
    if entry.get("record"):   # a pending restart's check, from any laptop, needs the patch's markers
        rolled["record"] = entry["record"]
    ledger.setdefault("rolled_back", {})[req["name"]] = rolled
    if changes:  # a patch whose files are all original already needs no restart to undo it
        # (nor one that the running server never ran: the laptop says what was pending before its write)
        ledger["restart_pending"] = bool(req.get("restart_pending", True))
        # the originals are back: recorded before a restart that may fail
        write_with_ledger(req, root, changes, previous, ledger, backups=False)
    else:
        save_ledger(req, ledger)
    out = {"restored": [c["path"] for c in changes if c["op"] == "restore"],
           "removed": [c["path"] for c in changes if c["op"] == "remove"],
           "files": dict((rel, describe_file(root, rel, False, (req.get("_container") or {}).get("root")))
                         for rel in entry["files"])}
    if req.get("restart") and (changes or previous.get("restart_pending")):
        out["restart"], out["probe"], _ = restart_with_probe(state, req, ledger, "rollback " + entry["label"])
        save_ledger(req, ledger)
    return out


def op_unlock(state, req):
    """Release this run's lock (a no-op when this run does not hold it)."""
    release_lock(state, req)
    return {"unlocked": True}


def op_record(state, req):
    """Write a verification verdict into the ledger. With a lock claim (a run that holds no
    lock: verify-logs) the read-modify-write is done under the host's lock, taken and released
    here; another run's lock there: nothing written, that lock returned."""
    claim = req.get("lock")
    if not claim:
        return record_verdict(state, req)
    if not take_lock(state, req, claim):
        return {"recorded": False, "lock": read_lock(req)}
    try:
        return record_verdict(state, req)
    finally:
        release_lock(state, req)


def record_verdict(state, req):
    update = req.get("ledger_update") or {}
    ledger = load_ledger(req)
    for name, verification in (update.get("verification") or {}).items():
        if name in ledger.get("patches", {}):
            ledger["patches"][name]["verification"] = verification
    if "last_verification" in update:
        ledger["last_verification"] = update["last_verification"]
    last = ledger.get("last_restart")
    if last and (update.get("last_verification") or {}).get("check") != "verify-logs":
        # the first verdict after a restart (host clock): verify-logs says `traffic` of what ran after
        # it, and `startup` of what ran before the ready line that this follow saw
        last.setdefault("verdict_epoch", time.time())
        ready = getattr(state.following, "ready_epoch", None)
        if ready is not None and last.get("ready_epoch") is None:
            last["ready_epoch"] = ready
    if last and req.get("log") and last.get("inode") is not None:
        # how far the verified window reached: a log cut below it no longer holds the evidence
        st = LogFollower._stat(expand(req["log"]))
        if st is not None and st.st_ino == last["inode"]:
            last["verified_size"] = st.st_size
        if state.following is not None and getattr(state.following.follower, "truncated", False):
            last["window_cut"] = True
    save_ledger(req, ledger)
    return {"recorded": True}
