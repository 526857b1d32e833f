"""The engine's files: read and describe them, write a set of changes all or nothing
under a journal, and finish (recover) what a run that died while writing left."""
import errno
import json
import os
import stat
import types

from . import inroot
from .base import (TMP_MARK, AgentError, LEDGER, atomic_write, expand, pack, read_bytes, refuse_links, sha256_bytes,
                   state_path)
from .ledger import save_ledger
from .procs import pid_alive


def safe_join(root, rel):
    full = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not full.startswith(os.path.normpath(root) + os.sep):
        raise AgentError("error", "refusing path outside the package directory: %r" % rel)
    return full


def writable_join(root, rel):
    """safe_join for a file fleetpatch will rename over: no symlink on the way, nor the file."""
    full = safe_join(root, rel)
    refuse_links(os.path.normpath(root), full, "in the package " + root)
    return full


def describe_file(root, rel, content, jail=None):
    """sha256, size, mode (and the bytes) of the package file `rel`, or None when absent.
    `jail`: a container's root (the host path): the file is read as the container resolves it."""
    path = safe_join(root, rel)
    try:
        if jail:
            data, st = inroot.read_stat(jail, path[len(jail):])
        else:
            data = read_bytes(path)
            st = os.stat(path)
    except (IOError, OSError) as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):   # ENOTDIR: a file where its folder would be
            return None
        raise
    out = {"sha256": sha256_bytes(data), "size": len(data), "mode": st.st_mode & 0o7777}
    if content:
        out["content"] = pack(data)
    return out


def remove_bytecode(path):
    """Delete the cached bytecode of a changed module, so the old code can't run."""
    directory, name = os.path.split(path)
    stem = os.path.splitext(name)[0]
    cache = os.path.join(directory, "__pycache__")
    removed = []
    try:   # a __pycache__ that is a symlink is not fleetpatch's to empty: it may lead anywhere
        entries = [] if os.path.islink(cache) else os.listdir(cache)
    except OSError:
        entries = []
    for entry in entries:
        if entry.startswith(stem + ".") and entry.endswith((".pyc", ".pyo")):
            try:
                os.unlink(os.path.join(cache, entry))
                removed.append(entry)
            except OSError:
                pass
    legacy = os.path.splitext(path)[0] + ".pyc"
    if os.path.exists(legacy):
        os.unlink(legacy)
        removed.append(os.path.basename(legacy))
    return removed


def digest(data):
    """sha256 of bytes; None for None (a file that does not exist)."""
    return None if data is None else sha256_bytes(data)


def read_or_none(path):
    """The bytes of `path`, or None when it does not exist."""
    try:
        return read_bytes(path)
    except (IOError, OSError) as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def sibling_meta(directory, name):
    """Mode and owner for a file fleetpatch creates in `directory`: those of a regular file
    beside it (one with the same extension first, so a new module looks like the package's
    other modules), else the folder's owner with mode 0644. Special bits are never copied."""
    ext = os.path.splitext(name)[1]
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    found = None
    for other in names:
        if other == name or other.startswith("."):
            continue
        try:
            st = os.lstat(os.path.join(directory, other))
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if os.path.splitext(other)[1] == ext:
            found = st
            break
        found = found or st
    if found is not None:
        return {"mode": found.st_mode & 0o777, "uid": found.st_uid, "gid": found.st_gid}
    st = os.stat(directory)
    return {"mode": 0o644, "uid": st.st_uid, "gid": st.st_gid}


def put_file(path, data, meta, own_meta=False):
    """Make `path` hold `data`, or not exist (None): renamed over the file, created beside
    its siblings with `meta`, or unlinked. An existing file keeps its own mode and owner
    unless `own_meta` (a deleted file put back over one made since)."""
    if data is None:
        try:
            os.unlink(path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
    elif os.path.lexists(path) and not own_meta:
        atomic_write(path, data, like=path)
    else:
        atomic_write(path, data, meta=meta)


def write_all_or_nothing(root, changes):
    """Bring each file to its new content (`data`; None: removed); on any failure put back
    what was done (`original`; None: the file did not exist, so it is removed again).
    `meta` is the mode and owner for whichever side is a file that is absent now."""
    done = []
    try:
        for ch in changes:
            path = writable_join(root, ch["path"])
            put_file(path, ch["data"], ch.get("meta"), ch.get("own_meta", False))
            done.append(ch)
            remove_bytecode(path)
    except BaseException as e:
        for ch in reversed(done):
            path = safe_join(root, ch["path"])
            put_file(path, ch["original"], ch.get("meta"))
            remove_bytecode(path)
        if isinstance(e, AgentError):
            raise
        raise AgentError("error", "%s %s failed (%s); every file was put back as it was"
                         % (VERB.get(changes[len(done)]["op"], "writing"), changes[len(done)]["path"], e))


# what a change does to its file, for messages
VERB = types.MappingProxyType({"create": "creating", "delete": "deleting", "modify": "writing",
                               "restore": "restoring", "remove": "removing"})


WRITING = "writing.json"   # in the state dir while engine files are being renamed: see recover()




def write_with_ledger(req, root, changes, previous, after, backups):
    """write_all_or_nothing under a journal, and when it put every file back, the ledger
    as it was (`previous`): a patch that is not in the files is never recorded, nor a
    restart for it.

    All-or-nothing must hold against the agent's own death too (kill -9, a lost host):
    the journal says which backup each file must end as, and which ledger then holds.
    The next run that takes the lock finishes it (recover): an apply is undone, a
    rollback completed; both end with every file restored from its backup."""
    # per file: the backup it ends as (target; None: the file ends absent, as before a
    # create), the other content it may hold (what an apply writes, or what a rollback
    # replaces; None: absent, as after a delete), and the mode and owner a file put back
    # from its backup gets when it is absent
    journal = {"root": root, "ledger": after, "files": [
        {"path": ch["path"], "target": digest(ch["backup"]), "source": ch["source"], "meta": ch.get("meta"),
         "other": digest(ch["original"] if ch["data"] == ch["backup"] else ch["data"])} for ch in changes]}
    if backups:   # an apply: dying half-way, it is undone, and the ledger is the one before it
        journal["ledger"] = previous
    atomic_write(state_path(req, WRITING), json.dumps(journal, sort_keys=True).encode())
    try:
        write_all_or_nothing(root, changes)
    except AgentError:
        try:
            save_ledger(req, previous)
        except OSError as e:  # disk full: the journal stays, and the next run finishes this
            raise AgentError("error", "writing the engine files failed and every file was put back, but the ledger "
                             "%s could not be restored (%s); free space, then rerun"
                             % (state_path(req, LEDGER), e))
        os.unlink(state_path(req, WRITING))
        raise
    save_ledger(req, after)
    os.unlink(state_path(req, WRITING))


def tmp_owner(name):
    """The pid in a `.NAME.fleetpatch-PID.tmp` name, else None."""
    if not (name.startswith(".") and name.endswith(".tmp") and TMP_MARK in name):
        return None
    try:
        return int(name[:-len(".tmp")].rsplit(TMP_MARK, 1)[1])
    except ValueError:
        return None


def remove_stale_tmp(directory, prefix=""):
    """Delete the temp files of fleetpatch runs that died (their pid is gone) in `directory`."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        pid = tmp_owner(name)
        if pid is None or not name.startswith("." + prefix) or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
        except OSError:
            pass
    return removed


def recover(req):
    """Finish what a dead run left (called with the lock held): a journaled write is
    brought to its backups, and every temp file of a dead run is removed."""
    out = {}
    path = state_path(req, WRITING)
    journal = None
    try:
        with open(path) as f:
            journal = json.load(f)
    except (IOError, OSError, ValueError):
        pass
    if journal:
        root = journal["root"]
        if req.get("_container") and root.startswith("/proc/"):
            # written through the container's root under its pid then: a restart since gave it another
            root = inroot.host_path(req["_container"]["root"], "/" + root.split("/", 4)[4])
        restored, left = [], []
        for f in journal["files"]:
            full = writable_join(root, f["path"])
            remove_stale_tmp(os.path.dirname(full))
            try:
                current = digest(read_or_none(full))   # None: absent (a created file not yet, a deleted one)
            except (IOError, OSError) as e:
                current = "unreadable (%s)" % e
            if current == f["target"]:
                continue
            if current != f["other"]:
                left.append(f["path"])
                continue
            if f["target"] is None:   # the run was creating it (or a rollback removing it)
                put_file(full, None, None)
            else:
                backup = read_or_none(state_path(req, f["source"]))
                if digest(backup) != f["target"]:
                    left.append(f["path"])
                    continue
                put_file(full, backup, f.get("meta"))
            remove_bytecode(full)
            restored.append(f["path"])
        if left:
            raise AgentError("drift", "a fleetpatch run died while writing, and %s now match neither the original nor "
                             "what it wrote; the journal %s and the backups in %s say what was meant; restore "
                             "them by hand, then remove the journal" % (", ".join(left), path, state_path(req)))
        save_ledger(req, journal["ledger"])
        os.unlink(path)
        out["finished_write"] = restored
    stale = []
    for directory, _, _ in os.walk(state_path(req)):
        stale += remove_stale_tmp(directory)
    pidfile = (req.get("restart") or {}).get("pidfile")
    if pidfile:
        pidfile = expand(pidfile)
        stale += remove_stale_tmp(os.path.dirname(pidfile) or ".", os.path.basename(pidfile))
    if stale:
        out["removed_tmp"] = stale
    return out
