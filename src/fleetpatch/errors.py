"""fleetpatch's errors, the statuses a host can end in, and the exit codes.

Every error a user can cause before any host is changed (bad command line,
bad inventory, bad patch) is a `UsageError`. A failure that belongs to one
host is a `HostFailure` carrying that host's `Status`. Their `str()` is the
whole message the user sees: which host or file, which key or line, what is
wrong, and when useful what to do. Exit codes are decided in one place,
`exit_code`, from the kind of error.
"""
from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """Where one host ended, as the report and the summary name it.

    A `str` subclass: `Status.VERIFIED == "verified"`, and it is written to
    JSON and f-strings as its value."""

    FETCHED = "fetched"
    APPLIES = "applies"
    APPLIED = "applied"
    ALREADY_APPLIED = "already-applied"
    VERIFIED = "verified"
    NOT_EXECUTED = "not-executed"
    UNPROVEN = "unproven"               # the patched function ran, none of its added lines yet: a failure (exit 1)
    DRIFT = "drift"
    CONFLICT = "conflict"
    UNREACHABLE = "unreachable"
    HOST_KEY_REJECTED = "host-key-rejected"
    AUTH_FAILED = "auth-failed"
    LOCKED = "locked"
    RESTART_FAILED = "restart-failed"
    TIMEOUT = "timeout"
    ROLLED_BACK = "rolled-back"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"
    PENDING = "pending"
    DRAIN_TIMEOUT = "drain-timeout"     # a router-aware restart: the worker kept requests past --drain-timeout
    SMOKE_FAILED = "smoke-failed"       # restarted and verified, but the smoke request got no well-formed answer
    ROUTER_ERROR = "router-error"       # a router could not be used (unreachable, worker not listed, refused)
    PATCH_LOST = "patch-lost"           # a container host's container was re-created since the deploy: the image's files
    OK = "ok"
    ERROR = "error"

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def succeeded(self) -> bool:
        """A status a command counts as success when it is what the command is for."""
        return self in _SUCCESS


_SUCCESS = {Status.FETCHED, Status.APPLIES, Status.APPLIED, Status.ALREADY_APPLIED, Status.VERIFIED,
            Status.ROLLED_BACK, Status.OK}

# Statuses of a host fleetpatch never got to change (it may not even have been reached).
NOT_STARTED = {Status.UNREACHABLE, Status.HOST_KEY_REJECTED, Status.AUTH_FAILED, Status.SKIPPED}


class FleetpatchError(Exception):
    """Base class of fleetpatch's own errors."""


class UsageError(FleetpatchError):
    """A usage, inventory or patch error found before any host was changed (exit 2)."""


class NoAnswer(str, Enum):
    """Why a host's answer to a request never came (set where the transport gives up).
    The host may have done some or all of what it was asked: its ledger says what."""

    TIMEOUT = "timeout"                # no answer within the request's bound
    STALLED = "stalled"                # the connection stopped moving (no tick from a ticking agent)
    SEND_FAILED = "send-failed"        # the session closed while the request was being sent
    CHANNEL_CLOSED = "channel-closed"  # the session closed with no exit status (link or sshd died)
    AGENT_EXITED = "agent-exited"      # the agent process ended before it answered
    NO_SESSION = "no-session"          # no new session could be opened for the request mid-run

    __str__ = str.__str__


class HostFailure(FleetpatchError):
    """A per-host failure: the host ends with `status`, the run goes on for the others.
    `cause` is set when the host's answer never came (the host may have acted). `reason`, where
    the raiser gives one, is what failed in its own words, without the host's name or what that
    left on the host (the drain's router steps: for a caller that says the rest its own way)."""

    def __init__(self, status: str, message: str, cause: NoAnswer | None = None, reason: str | None = None):
        super().__init__(message)
        self.status = Status(status)
        self.message = message
        self.cause = cause
        self.reason = reason


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Terminated(KeyboardInterrupt):
    """A signal from outside ends the run: SIGTERM (a `kill`, a CI job's timeout, a service manager
    stopping the shell) or SIGHUP (the terminal, or the SSH session to the machine it runs on, went
    away). The run stops as it does at a Ctrl-C, so that no host is left half-done and locked."""

    def __init__(self, cause: str = "SIGTERM"):
        super().__init__()
        self.cause = cause


def interrupt_cause(exc: BaseException) -> str:
    """What interrupted the run, as its messages name it: "Ctrl-C", "SIGTERM" or "SIGHUP"."""
    return getattr(exc, "cause", "Ctrl-C")


def raise_terminated(signum, frame) -> None:
    """The SIGTERM handler: the main thread gets `Terminated` where a Ctrl-C gets KeyboardInterrupt."""
    import signal
    raise Terminated(signal.Signals(signum).name)


def exit_code(exc: BaseException | None) -> int:
    """The process exit code for how a command ended (None: it ended normally)."""
    if exc is None:
        return EXIT_OK
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    return EXIT_FAILED
