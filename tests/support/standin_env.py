"""Server environment the tests give the SGLang stand-in where nothing depends on its default."""
from __future__ import annotations

# A TERMed stand-in first looks for unfinished requests FLEETPATCH_STANDIN_SIGTERM_POLL seconds
# after the signal (default 0.5 s; SGLang's watchdog: 5 s), then every as many seconds: each
# reset and restart of a host with nothing in flight would wait that long for nothing.  The
# tests of the drain (requests in flight at a SIGTERM) give their servers their own value.
QUICK_STOP = {"FLEETPATCH_STANDIN_SIGTERM_POLL": "0.05"}
