"""Per-host operations: the remote seam plus the pure parts, composed.

Each step is called as `step(job, host)`: a `Job` (what the operator asked for)
and one host; it returns a `HostResult` and never raises for a host's failure.
`host_step` opens the host's `HostRun` (host, job, remote, lock, version,
clock), which carries what every part of the step needs. The round trips of
a deploy: probe+lock, apply+restart, follow+record+unlock, all to one agent
process on the host.

By job: `context` (Job, HostRun, host_step), `lock` (HostLock: one `with`
block per host), `fetching`, `plan` (and check-patch), `follow` (the log
streamed and judged), `verify` (and verify-logs, and the shaping of results), `deploying`, `rolling_back`,
`hoststatus`, `restarting` (restart and verify, the undo step a parameter),
`servers` (several servers on one install), `nodes` (a node group's
ranks as one unit: `step(job, hosts)`, one result per rank). The requests and replies are the records of `protocol`.
"""
from __future__ import annotations

from .. import diffapply, protocol  # noqa: F401  (steps.protocol, steps.diffapply: used by tests)
from ..hostcalls import HostResult, base_request  # noqa: F401  (steps.HostResult is the API)
from ..remote import Remote  # noqa: F401
from . import follow  # noqa: F401
from .context import HostRun, Job, host_step, probe, sha256  # noqa: F401
from .deploying import apply_files, deploy  # noqa: F401
from .fetching import fetch  # noqa: F401
from .follow import Watch, follow_ahead, follow_and_judge  # noqa: F401
from .hoststatus import status  # noqa: F401
from .lock import HostLock  # noqa: F401
from .nodes import deploy_nodes, rollback_nodes  # noqa: F401
from .plan import check_patch, file_bytes, make_plan, packed, revision_files  # noqa: F401
from .rolling_back import rollback  # noqa: F401
from .verify import fold_rollback, no_answer, verify_logs  # noqa: F401
