"""What every command shares: flag help and value checks, the `command`
decorator that turns an error into one line and its exit code, and the run of
one step over the selected hosts.

Imported by the command modules (`cli_hosts`, `cli_fleet`); it imports none of
them, so there is no cycle and no optional import to fail silently. What runs a
command (inventory, patches, steps, the report) is imported inside the functions
that run one: `fleetpatch --help`, `--version` and a usage error never load it
(tests/fast/test_cli_imports.py).
"""
from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from invoke import task
from invoke.tasks import Task
from invoke.exceptions import Exit

from .errors import FleetpatchError, UsageError, exit_code, interrupt_cause
from .textsafe import safe_line

HELP = {
    "inventory": "the inventory file (default: ./hosts.yaml, or $FLEETPATCH_INVENTORY)",
    "hosts": "comma-separated host names from the inventory",
    "group": "the hosts of this inventory group, or the ranks of this node group ('all' is every host)",
    "report": "also write the JSON report to this path (checked before any host is contacted)",
    "parallel": "hosts worked on at once, a whole number of 1 or more (default: all selected, capped at 32)",
    "patches": "look patches up in DIR first, then ./patches, then the shipped ones",
    "patch": "NAME (newest revision admitting the host's engine version) or NAME@REV",
    "timeout": "seconds to wait for the markers after a restart, a number above 0 "
               "(default: server.ready_timeout)",
    "accept_new_host_keys": "trust unknown host keys and record them (a changed key is always refused)",
    "break_lock": "break a lock left behind by a dead fleetpatch run",
    "force": "proceed although the pre-flight check says the patched path would not run",
    "drain_timeout": "router section: seconds to wait for a worker out of its routers to finish its requests "
                     "(default 600; on expiry it is put back unrestarted, status drain-timeout)",
    "max_unavailable": "router section: at most N workers out of a router at once (default: the hosts worked "
                       "on at once); a run that could take more, or a router's last healthy worker, is refused",
    "no_probe": "judge execution by the patch's markers alone: no probe in the server's interpreter "
                "(the patch must then have a marker for every code path it changes)",
    "no_router": ("restart as if the inventory had no router section (no drain; the smoke requests "
                  "still go to the server itself)"),
    "verbose": "print each host's evidence: the log lines seen (with their line numbers) and the server "
               "facts (launch flags and env, /server_info) that decided the path",
}

# The placeholder shown after each flag in `--help` (Invoke would say STRING).
METAVAR = {"inventory": "PATH", "hosts": "A,B", "group": "GROUP", "report": "PATH", "parallel": "N",
           "patches": "DIR", "patch": "NAME[@REV]", "timeout": "SECONDS", "dest": "DIR", "canary": "N",
           "batch": "N", "max_failures": "K", "drain_timeout": "SECONDS", "max_unavailable": "N",
           "bake": "SECONDS", "on_failure": "keep|rollback", "root": "DIR"}

PATCH_NEEDED = "the patch to use, NAME or NAME@REV (see patches/ or fleetpatch's shipped patches)"

COMMON = ("inventory", "hosts", "group", "report", "parallel", "patches", "accept_new_host_keys", "verbose")
# fetch and status look no patch up: --patches is not theirs
NO_PATCH = tuple(n for n in COMMON if n != "patches")

# What a command's usage line names before [--options]: the options it cannot run without.
SELECTION = "(--hosts A,B | --group GROUP)"
REQUIRED = {"check-patch": "--patch NAME[@REV]", "deploy-patch": f"--patch NAME[@REV] {SELECTION}",
            "rollout": f"--patch NAME[@REV] {SELECTION}", "rollback": SELECTION}


def usage_line(program: str, command: str) -> str:
    """`Usage: fleetpatch CMD` with the options it needs, wrapped to the help's width."""
    import textwrap
    head = f"Usage: {program} {command} "
    needs = " ".join(filter(None, [REQUIRED.get(command), "[--options]"]))
    return textwrap.fill(needs, max(len(head) + 20, help_width()), initial_indent=head,
                         subsequent_indent=" " * len(head), break_on_hyphens=False)


def help_width() -> int:
    """The terminal's width ($COLUMNS first), or 80 where there is none (piped, a CI log)."""
    import shutil
    return shutil.get_terminal_size((80, 24)).columns


def wrapped(text: str, width: int, indent: str) -> list[str]:
    """`text` as lines of `width` at most, each starting with `indent`; a flag is never split."""
    import textwrap
    return textwrap.wrap(text, max(len(indent) + 20, width), break_on_hyphens=False, break_long_words=False,
                         initial_indent=indent, subsequent_indent=indent) or [indent.rstrip()]


def column_lines(rows, width: int, indent: str = "  ", padding: int = 3) -> list[str]:
    """(flag, help) rows as two columns of `width`, each help wrapped within its column; where
    that column would be narrower than 30, each help goes on the lines below its flag instead."""
    flag_width = max(len(flag) for flag, _ in rows)
    column = len(indent) + flag_width + padding
    out = []
    for flag, text in rows:
        if width - column >= 30:
            lines = wrapped(text or "", width, " " * column)
            out.append((indent + flag.ljust(flag_width + padding) + lines[0][column:]).rstrip())
            out += lines[1:]
        else:
            out.append(indent + flag)
            out += [ln for ln in wrapped(text or "", width, indent + "    ") if ln.strip()]
    return out


SHORT_FLAGS = {"verbose": "v"}   # the only short flags of a command (no automatic ones)


@dataclass
class Common:
    """The flags every host command has (COMMON), as given."""

    inventory: str | None = None
    hosts: str | None = None
    group: str | None = None
    report: str | None = None
    parallel: str | None = None
    patches: str | None = None
    accept_new_host_keys: bool = False
    verbose: bool = False


class FleetpatchTask(Task):
    """An Invoke task whose short flags are SHORT_FLAGS only."""

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts
ROUTER = ("drain_timeout", "max_unavailable", "no_router")


def helps(*names, **extra) -> dict:
    return {**{n: HELP[n] for n in names}, **extra}


class RunFailed(FleetpatchError):
    """At least one host failed; its story is already printed (exit 1)."""


class RefusedUnchanged(RunFailed, UsageError):
    """Every selected host was refused before anything on it changed, for a patch that
    cannot be proven there (an engine release the profile does not know, and no way to
    prove the result): a patch error found before any host was changed (exit 2). Where
    another host went ahead, the run changed hosts, and the refusal is a failure (exit 1)."""


class OutcomeShown(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C) and its outcome is printed: the exit code is all that is left."""


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """The one line of a run interrupted before its hosts were at work; a SIGTERM says so."""
    cause = interrupt_cause(exc)
    return "fleetpatch: interrupted" + ("" if cause == "Ctrl-C" else f" ({cause})")


def err_line(msg: str) -> None:
    # one line: a value quoted from a file or the command line cannot break it or act on the terminal
    print(f"fleetpatch: error: {safe_line(msg)}", file=sys.stderr, flush=True)


def command(**task_kw):
    """An Invoke task of fleetpatch: flags only (no positionals, which would
    swallow `--help` as a value), no automatic short flags (so `-p` cannot mean
    two things), and exit codes mapped once from the error type."""

    def wrap(fn):
        @functools.wraps(fn)
        def body(c, **kw):
            if any(v in ("--help", "-h") for v in kw.values()):
                # `invoke cmd --patch --help`: Invoke took --help as the flag's value
                print_help(fn, task_kw.get("help", {}))
                raise Exit(code=0)
            try:
                fn(c, **kw)
            except RunFailed as e:
                raise Exit(code=exit_code(e)) from None
            except FleetpatchError as e:
                err_line(str(e))
                raise Exit(code=exit_code(e)) from None
            except KeyboardInterrupt as e:
                if not isinstance(e, OutcomeShown):   # Ctrl-C before the command had hosts at work
                    print(interrupted_line(e), file=sys.stderr, flush=True)
                raise Exit(code=exit_code(e)) from None

        return task(body, positional=[], auto_shortflags=False, klass=FleetpatchTask, **task_kw)

    return wrap


def print_help(fn, helps_: dict) -> None:
    """A command's help from its signature, for when Invoke's parser cannot give it."""
    import inspect
    import os
    name = fn.__name__.replace("_", "-")
    width = help_width()
    print(usage_line(os.path.basename(sys.argv[0]) or "fleetpatch", name))
    print("")
    print("\n".join(wrapped((inspect.getdoc(fn) or "").splitlines()[0], width, "  ")))
    print("")
    print("Options:")
    rows = []
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        flag = "--" + p.name.replace("_", "-")
        if p.name in SHORT_FLAGS:
            flag = f"-{SHORT_FLAGS[p.name]}, {flag}"
        if not isinstance(p.default, bool):
            flag += "=" + METAVAR.get(p.name, "VALUE")
        rows.append((flag, helps_.get(p.name, "")))
    print("\n".join(column_lines(sorted(rows), width)))
    print("")


# ----------------------------------------------------------------- values

def count(flag: str, value, *, minimum: int, default: int | None = None) -> int | None:
    """A whole-number flag value, at least `minimum`."""
    if value in (None, ""):
        return default
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"--{flag}: expected a whole number of {minimum} or more, got {value!r}") from None
    if n < minimum:
        raise UsageError(f"--{flag}: expected a whole number of {minimum} or more, got {n}")
    return n


def seconds(flag: str, value) -> float | None:
    if value in (None, ""):
        return None
    try:
        t = float(str(value).strip())
    except ValueError:
        raise UsageError(f"--{flag}: expected seconds (a number above 0, e.g. 30 or 2.5), got {value!r}") from None
    if not t > 0 or t == float("inf"):
        raise UsageError(f"--{flag}: expected seconds (a number above 0, e.g. 30 or 2.5), got {value!r}")
    return t


def choice(flag: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UsageError(f"--{flag}: expected {' or '.join(choices)}, got {value!r}")
    return value


def required(flag: str, value, what: str):
    if value in (None, ""):
        raise UsageError(f"--{flag} is required: {what}")
    return value


# ----------------------------------------------------------------- running

# Commands that judge a deployed patch by the host's record of it: --patch needs no folder here.
BY_HOST_RECORD = ("verify-logs", "rollback")


def prepare(*, inventory, hosts, group, patches, patch, changes_hosts, report=None, by_host_record=False):
    """Everything checked before a host is contacted: the report path, the
    inventory and selection, the patch. Raises UsageError. With `by_host_record`,
    a patch this laptop has no folder of is left to the hosts' records (None)."""
    from . import report as rep
    from .inventory import load_inventory, resolve_inventory_path
    from .patchset import MANIFEST, load_patch, parse_ref, search_dirs
    rep.check_report_path(report)
    inv = load_inventory(resolve_inventory_path(inventory))
    selected = inv.select(hosts or None, group or None, changes_hosts=changes_hosts)
    dirs = search_dirs(patches or None, Path.cwd())
    patch_obj, rev = None, None
    if patch and by_host_record and not any((d / parse_ref(patch)[0] / MANIFEST).is_file() for d in dirs):
        return inv, selected, dirs, None, None
    if patch:
        patch_obj, rev = load_patch(patch, dirs, patch_profile(patch, dirs, selected))
    return inv, selected, dirs, patch_obj, rev


def patch_profile(patch: str, dirs, selected):
    """The profile of the engine the patch names (`engine:` in its patch.yaml): a selected host of
    another engine is refused for that host alone, nothing written there. The hosts' engine when the
    manifest names none fleetpatch has a profile for (load_patch then says what is wrong)."""
    from . import engines
    from .patchset import manifest_engine
    engine = manifest_engine(patch, dirs)
    if engine and engine.strip().lower() in engines.kinds():
        return engines.get(engine)
    return engines.for_hosts(selected)


def check_probe_off(patch_obj, selected, no_probe: bool) -> None:
    """With the probe off (--no-probe, or engine.probe: false on a selected host) the patch's
    markers alone judge execution: a path it changes without a marker is refused (exit 2)."""
    from . import engines
    from .patchset import PatchError, require_markers
    if patch_obj is None:
        return
    if no_probe:
        why = "--no-probe"
    else:
        off = [h.name for h in selected if not getattr(h.engine, "probe", True)]
        if not off:
            return
        why = f"engine.probe: false (host{'s' if len(off) > 1 else ''} {', '.join(off)})"
    try:
        require_markers(patch_obj, engines.get(patch_obj.engine), why)
    except PatchError as e:
        raise UsageError(str(e)) from None


@contextlib.contextmanager
def ctrl_c_held():
    """Ctrl-C does nothing while the outcome is printed and the report written: every host has
    finished by then, and a Ctrl-C there cut the summary off and left no report, hiding how each
    host ended. (Only the main thread receives signals: elsewhere nothing is changed.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def finish(console, task_name, results, started, flags: Common, stop=None, extra=None) -> None:
    """Print the outcome (with -v each host's evidence), write the report, end with the right exit code."""
    from . import report as rep
    report_path = flags.report
    stopped = stop.describe(results) if stop is not None else None
    interrupted = bool(stop is not None and stop.interrupted)
    ok = all(r.ok for r in results.values()) and not interrupted
    with ctrl_c_held():
        try:
            if flags.verbose:
                rep.print_evidence(console, results)
            rep.print_outcome(console, task_name, results, [stopped] if stopped else [], interrupted=interrupted)
        except OSError:
            # The reader went away (`| head`) or the terminal hung up: the report below still says
            # what every host ended as, and the exit code stays the run's.
            rep.output_gone(console)
        if report_path:
            doc_extra = dict(extra or {})
            if stop is not None and stop.reason:
                doc_extra["stopped"] = stopped
                doc_extra["interrupted"] = stop.interrupted
            rep.write_report(report_path, task_name, ok, started, results, doc_extra)
    if interrupted:
        raise OutcomeShown
    if not ok:
        if all((r.details or {}).get("refused") == "unprovable" for r in results.values()):
            raise RefusedUnchanged(f"{task_name} refused")
        raise RunFailed(f"{task_name} failed")


def router_settings(drain_timeout=None, max_unavailable=None, no_router=False) -> dict:
    """The router flags, checked (before the inventory is read)."""
    return {"drain_timeout": seconds("drain-timeout", drain_timeout) or 600.0,
            "max_unavailable": count("max-unavailable", max_unavailable, minimum=1), "no_router": bool(no_router)}


def make_drainer(selected, stages, router: dict | None, tunnels, preflight: bool = True, require_listed: bool = True):
    """The router-aware restart of this run (None: no router applies, or --no-router), reaching
    router.via's hosts through `tunnels` (the run's router_via.Tunnels).
    With `preflight`, every router is checked and the capacity of every stage, before
    any host is touched (UsageError, exit 2). `require_listed` off: a worker the router does not
    list is let through (a rollback, or --break-lock finishing a dead run that had taken it out):
    the drain skips it, and it goes in when it is put back."""
    from . import drain
    if not router or router.get("no_router") or not any(h.router is not None for h in selected):
        return None
    if preflight:
        drain.preflight(selected, stages, router.get("max_unavailable"), require_listed, tunnels)
    return drain.Drainer(drain_timeout=router["drain_timeout"], max_unavailable=router.get("max_unavailable"),
                         tunnels=tunnels, all_listed=preflight and require_listed)


def run_hosts(task_name: str, step, flags: Common, *, patch=None, changes_hosts=False, router: dict | None = None,
              group_step=None, **job_kw) -> None:
    """Run `step` over the selected hosts, at most --parallel at once, and finish; `group_step`
    runs each node group's ranks together."""
    from . import report as rep
    from . import rollout as fleet
    from . import steps
    from .patchset import parse_ref
    parallel_n = count("parallel", flags.parallel, minimum=1)
    job_kw["timeout"] = seconds("timeout", job_kw.get("timeout"))
    inv, selected, dirs, patch_obj, rev = prepare(inventory=flags.inventory, hosts=flags.hosts, group=flags.group,
                                                  patches=flags.patches, patch=patch, changes_hosts=changes_hosts,
                                                  report=flags.report, by_host_record=task_name in BY_HOST_RECORD)
    if patch and patch_obj is None:
        job_kw["patch_name"] = parse_ref(patch)[0]
    if task_name in ("deploy-patch", "verify-logs"):
        check_probe_off(patch_obj, selected, not job_kw.get("probe", True))
    at_once = fleet.default_parallel(len(selected), parallel_n)
    job = steps.Job(hosts_by_name=inv.hosts, patch=patch_obj, rev=rev, patch_dirs=dirs,
                    inventory_arg=flags.inventory, accept_new_host_keys=flags.accept_new_host_keys, **job_kw)
    with run_tunnels(job) as tunnels:   # router.via's connections: this run's, closed at its end
        job.drain = make_drainer(selected, [selected[i:i + at_once] for i in range(0, len(selected), at_once)],
                                 router, tunnels, preflight=changes_hosts,
                                 require_listed=task_name != "rollback" and not job_kw.get("break_lock"))
        console = rep.make_console()
        started = rep.now_iso()
        with rep.View(task_name, [h.name for h in selected], console=console) as view:
            job.progress = view.progress
            fn = (fleet.by_unit(functools.partial(step, job), functools.partial(group_step, job)) if group_step
                  else fleet.each_host(functools.partial(step, job)))
            results, stop = fleet.run_all(selected, fn, parallel_n, job.interrupt)
    finish(console, task_name, results, started, flags, stop)


def run_tunnels(job):
    """The run's router.via connections, dialled as its hosts are (--accept-new-host-keys, its Ctrl-C)."""
    from .router_via import Tunnels
    return Tunnels(job.accept_new_host_keys, job.interrupt)
