"""The ledger (what fleetpatch did on this host): read, and written in one place, atomically.

A host with several servers sharing one install (`server_names` in the request) keeps
each server's restart bookkeeping (SERVER_KEYS) in `servers.<name>`; a request for one
server (`server_name`) sees that server's as the ledger's own keys, so every step reads
and writes the ledger as on a one-server host. The top-level `restart_pending` is then
"some server still runs code older than the files"."""
import errno
import json

from .base import AgentError, LEDGER, atomic_write, ensure_state_dir, protocol, state_path

SERVER_KEYS = ("last_restart", "restart_pending", "last_verification")


def load_ledger(req):
    path = state_path(req, LEDGER)
    try:
        with open(path, "r") as f:
            ledger = json.load(f)
    except (IOError, OSError) as e:
        if e.errno == errno.ENOENT:
            ledger = protocol.empty_ledger()
        else:
            raise
    except ValueError:
        raise AgentError("error", "the ledger %s is not valid JSON; fix or move it away" % path)
    name = req.get("server_name")
    if name and req.get("server_names"):
        slot = (ledger.get("servers") or {}).get(name) or {}
        for key in SERVER_KEYS:
            ledger[key] = slot.get(key, False if key == "restart_pending" else None)
    return ledger


def save_ledger(req, ledger):
    """The one place the ledger is written (atomically: a reader sees the old or the new one)."""
    names = req.get("server_names")
    out = dict(ledger)   # the caller's ledger keeps its (projected) keys for a later save of the same request
    if names:
        slots = ledger["servers"] = out["servers"] = dict(ledger.get("servers") or {})
        name = req.get("server_name")
        if name:
            slots[name] = dict((key, ledger.get(key)) for key in SERVER_KEYS)
        elif ledger.get("restart_pending"):
            # the install changed (apply, rollback): the servers named must restart to run it
            pending = req.get("servers_pending") or names
            for n in names:
                slot = slots.setdefault(n, {})
                slot["restart_pending"] = bool(slot.get("restart_pending")) or n in pending
        out["restart_pending"] = any(s.get("restart_pending") for s in slots.values())
    ensure_state_dir(state_path(req))
    atomic_write(state_path(req, LEDGER), (json.dumps(out, indent=1, sort_keys=True) + "\n").encode())
