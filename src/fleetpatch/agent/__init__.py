"""The half of fleetpatch that runs on a host, under the engine's own interpreter.

Sent over SSH on stdin when a command starts (never installed), so a host
needs nothing but the Python that already runs its engine. Stdlib only,
Python 3.8+. One process per host per command: the laptop starts it once
(`agentboot` loads these modules, through a compile cache) and sends it every
request of the operation as JSON lines on the same channel, then `bye`. The
laptop decides; this side only reads, writes atomically, restarts and follows
the log. Keeping the steps of one phase in one request is what keeps a deploy
at three requests (probe+lock, apply+restart, follow+record+unlock).

Every deadline here uses the monotonic clock: a clock step on the host must
not end a wait early or late. All the agent's state is one `AgentState` per
session (state.py), passed explicitly; no module holds any.

On a host, fleetpatch is not installed: agentboot registers these modules as
HOST_PACKAGE.<name>, in the order of MODULES (each imports only modules
before it, relatively), then calls `session.serve`. This file itself is not
sent: on the host the package is an empty one that agentboot makes.
"""

HOST_PACKAGE = "fleetpatch_agent"

# The order agentboot loads them in: each module imports only modules before it
# (tests/test_layers.py checks it).
MODULES = ("base", "apikey", "inroot", "procs", "http", "runtime_api", "ledger", "files", "lock", "state", "package", "container", "container_probe",
           "probing", "restart", "logs", "smoke", "follow", "ops", "serving", "session")

ENTRY = "session"   # its serve(fd, boot) is the request loop
