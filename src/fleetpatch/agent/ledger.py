"""The ledger (what fleetpatch did on this host): read, and written in one place, atomically."""
import errno
import json

from .base import AgentError, LEDGER, atomic_write, ensure_dir, protocol, state_path


def load_ledger(req):
    path = state_path(req, LEDGER)
    try:
        with open(path, "r") as f:
            return json.load(f)
    except (IOError, OSError) as e:
        if e.errno == errno.ENOENT:
            return protocol.empty_ledger()
        raise
    except ValueError:
        raise AgentError("error", "the ledger %s is not valid JSON; fix or move it away" % path)


def save_ledger(req, ledger):
    """The one place the ledger is written (atomically: a reader sees the old or the new one)."""
    ensure_dir(state_path(req))
    atomic_write(state_path(req, LEDGER), (json.dumps(ledger, indent=1, sort_keys=True) + "\n").encode())
