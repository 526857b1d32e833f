"""What the operator sees: progress while hosts work, a summary, the loud
failure details last, and the JSON report.

Everything that came from a host goes through `textsafe` (control bytes
escaped, never rich markup). Off a terminal (CI logs, `| tee`) nothing is cut
or wrapped at a width: lines are as long as they are.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import Status, UsageError
from . import redact
from .textsafe import cell, safe, safe_line

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# Off a terminal rich would lay tables out for 80 columns and cut them; this
# width is never reached, so a table is as wide as its content.
_UNBOUNDED = 100_000


class LineConsole:
    """Until something needs rich (a table, a style, the live view), lines go
    straight to the stream: rich costs tens of milliseconds to import, and a
    run's first SSH connect should not wait for them. Off a terminal, progress
    lines never need it; the summary at the end does, and `preload` imports it
    in the background while the hosts work."""

    def __init__(self, stderr: bool = False):
        self.stderr = stderr
        self._rich = None
        stream = sys.stderr if stderr else sys.stdout
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        # rich decides on its own when it is a terminal or when told to pretend (FORCE_COLOR, TTY_COMPATIBLE)
        if tty or os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE"):
            self._resolve()

    @property
    def rich(self) -> "Console":
        return self._resolve()

    def _resolve(self) -> "Console":
        if self._rich is None:
            from rich.console import Console

            class ReaderGoneConsole(Console):
                def on_broken_pipe(self) -> None:
                    # rich's own answer is SystemExit(1), raised in whichever thread printed: a
                    # host's thread mid-step, or the run before its report. Here the rest of the
                    # output goes to /dev/null and the run goes on.
                    self.quiet = True
                    _to_devnull(self.file)

            probe = Console(stderr=self.stderr)
            width = None if probe.is_terminal else _UNBOUNDED
            self._rich = ReaderGoneConsole(stderr=self.stderr, highlight=False, soft_wrap=True, width=width)
        return self._rich

    @property
    def is_terminal(self) -> bool:
        return self._rich is not None and self._rich.is_terminal

    def line(self, text: str) -> None:
        """One plain line (already made safe)."""
        stream = sys.stderr if self.stderr else sys.stdout
        try:
            if self._rich is not None:
                self._rich.print(text, markup=False, highlight=False, soft_wrap=True)
            else:
                stream.write(text + "\n")
                stream.flush()
        except OSError:
            # The reader went away (`| head`, a `tee` ended by the same hangup) or the terminal hung
            # up. A host's thread prints its progress here mid-step: the step goes on, the rest of
            # the output goes to /dev/null, and the report still records every host.
            _to_devnull(stream)

    def print(self, *objects, **kw) -> None:
        self._resolve().print(*objects, **kw)


def output_gone(console) -> None:
    """Nobody reads `console`'s stream any more (its reader went away, its terminal hung up): what
    is still printed there goes to /dev/null. The other stream is left as it is: with stdout piped
    into `head`, an error line on stderr still reaches the terminal."""
    if isinstance(console, LineConsole):
        _to_devnull(sys.stderr if console.stderr else sys.stdout)
    else:
        _to_devnull(getattr(console, "file", sys.stdout))


def _to_devnull(stream) -> None:
    from .outputgone import to_devnull
    try:
        to_devnull(stream.fileno())
        stream.flush()   # what the failed write left in the buffer goes there too
    except (OSError, ValueError):
        pass


def preload() -> None:
    """Import what the summary needs, in the background, while hosts are busy on the network."""
    def load():
        try:
            import rich.console  # noqa: F401
            import rich.table  # noqa: F401
            import rich.text  # noqa: F401
        except Exception:   # the summary's own import reports any real problem
            pass
    threading.Thread(target=load, name="fleetpatch-preload", daemon=True).start()


def make_console(stderr: bool = False) -> LineConsole:
    """A console that wraps nothing off a terminal (rich's default is 80 columns)."""
    return LineConsole(stderr=stderr)


def say(console, text: str, style: str = "") -> None:
    """One message, host data in it escaped, never markup, never hard-wrapped."""
    if not style and isinstance(console, LineConsole):
        console.line(safe(text))
        return
    target = console.rich if isinstance(console, LineConsole) else console
    target.print(safe(text), style=style or None, markup=False, highlight=False, soft_wrap=True)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ----------------------------------------------------------------- counting

UNREACHABLE_LIKE = {Status.UNREACHABLE, Status.HOST_KEY_REJECTED, Status.AUTH_FAILED}
COUNT_ORDER = ("failed", "unreachable", "skipped", "interrupted")


def category(r) -> str:
    """What one host's result counts as: its own status when it succeeded
    (verified, rolled-back, ...), else failed / unreachable / skipped / interrupted."""
    status = Status(r.status) if r.status in Status._value2member_map_ else None
    if r.ok:
        return str(r.status)
    if status in UNREACHABLE_LIKE:
        return "unreachable"
    if status == Status.SKIPPED:
        return "skipped"
    if status == Status.INTERRUPTED:
        return "interrupted"
    return "failed"


def counts(results: dict) -> dict[str, int]:
    """Hosts per category, successes first (in the order they occur), then
    failed, unreachable, skipped, interrupted; categories with no host left out."""
    out: dict[str, int] = {}
    cats = [category(r) for r in results.values()]
    for c in cats:
        if c not in COUNT_ORDER:
            out[c] = out.get(c, 0) + 1
    for c in COUNT_ORDER:
        n = cats.count(c)
        if n:
            out[c] = n
    return out


def counts_line(results: dict) -> str:
    return ", ".join(f"{n} {c}" for c, n in counts(results).items())


# ----------------------------------------------------------------- live view

class View:
    """Per-host phases: a rich live table on a TTY (with each host's stage:
    canary, batch k of n), timestamped lines otherwise."""

    def __init__(self, task: str, hosts: list[str], console=None, live: bool | None = None):
        self.task = task
        self.console = console or make_console()
        self.live_enabled = self.console.is_terminal if live is None else live
        self.rows = {h: {"phase": "queued", "detail": "", "since": None, "stage": ""} for h in hosts}
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self._live = None
        self._last_line: dict[str, str] = {}
        self._preloaded = False
        self.bar = self.bar_task = None
        if self.live_enabled:
            from rich.progress import BarColumn, Progress, TextColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total}"))
            self.bar_task = self.bar.add_task(task, total=len(hosts))

    def __enter__(self):
        if self.live_enabled:
            from rich.live import Live

            target = self.console.rich if isinstance(self.console, LineConsole) else self.console
            # Live's own refresh (8 a second) renders the table from the rows as they are then:
            # built at every event instead, a 32-host rollout's ~850 events built ~850 tables of
            # 32 rows each, on the laptop's CPU the hosts' threads need (issue 34).
            self._live = Live(_LiveTable(self), console=target, refresh_per_second=8, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            with self.lock:   # as the frames before it: the summary that follows lists every host
                final = self._render(room=live_room(self._live.console), width=self._live.console.width)
            try:
                self._live.update(final)
                self._live.__exit__(*exc)
            except OSError:   # the terminal hung up (SIGHUP ignored): the outcome still goes to the report
                output_gone(self.console)

    def stage(self, host: str, stage: str) -> None:
        """Which stage of a rollout the host belongs to (shown in its own column)."""
        with self.lock:
            self.rows.setdefault(host, {"phase": "queued", "detail": "", "since": None})["stage"] = stage
        self.progress(host, "queued", stage)

    def progress(self, host: str, phase: str, detail: str = "") -> None:
        with self.lock:
            row = self.rows.setdefault(host, {"phase": "", "detail": "", "since": None, "stage": ""})
            if row["phase"] != phase:
                row["since"] = time.monotonic()
            row["phase"], row["detail"] = phase, detail
            # the time column's ends, noted now: the live table is drawn up to 1/8 s later
            if row.get("first") is None and phase != "queued":
                row["first"] = row["since"]
            if phase == "done" and not row.get("ended"):
                row["ended"] = time.monotonic()
            if phase == "done" and self.bar is not None:
                self.bar.advance(self.bar_task)
            if not self._preloaded and phase not in ("queued", "connect"):
                # the first host waits on its probe: the summary's imports ride on that wait
                self._preloaded = True
                preload()
            if self._live is not None:
                return   # drawn at Live's next refresh (_LiveTable)
            line = f"{phase} {detail}".strip()
            # verify ticks change every event; print a phase once, then only real changes
            key = phase if phase == "verify" else line
            if self._last_line.get(host) == key:
                return
            self._last_line[host] = key
        stamp = time.strftime("%H:%M:%S")
        say(self.console, f"{stamp} {safe_line(host):<12} {safe_line(line)}")

    def _render(self, room: int | None = None, width: int | None = None):
        """The table and the progress bar; with `room` (the lines a terminal has for host rows) at
        most that many rows, or a third of them where `width` turns each row into a block of
        lines, the others counted in the caption (rows_in_view)."""
        from rich.console import Group

        fitted = self._table(room)
        if room is not None and width is not None and fitted.needed_width() > width:
            fitted = self._table(max(room // BLOCK_LINES, 1))
        return Group(fitted, self.bar)

    def _table(self, room: int | None) -> "FittedTable":
        from rich.table import Table

        rows, hidden = rows_in_view(self.rows, room)
        table = Table(title=f"fleetpatch {self.task}", expand=False,
                      caption=f"and {hidden_line(hidden)}" if hidden else None)
        table.add_column("host")
        if any(row.get("stage") for row in self.rows.values()):
            table.add_column("stage")
        table.add_column("phase", min_width=10)
        table.add_column("time", justify="right", min_width=6)
        table.add_column("detail", min_width=44)
        staged = len(table.columns) == 5
        now = time.monotonic()
        for host, row in rows:
            style = ""
            if row["phase"] == "done":
                style = "green" if _done_well(row) else "bold red"
            if row.get("first") is None and row["phase"] not in ("queued",):
                row["first"] = row["since"]
            end = row.get("ended") or now
            took = f"{end - row['first']:.1f}s" if row.get("first") else ""
            if row["phase"] == "done" and not row.get("ended"):
                row["ended"] = now
            cells = [cell(host)] + ([cell(row.get("stage", ""))] if staged else []) + [
                cell(row["phase"]), cell(took), cell(row["detail"])]
            table.add_row(*cells, style=style)
        return keep_whole(table)


def _done_well(row: dict) -> bool:
    return row["detail"] in Status._value2member_map_ and Status(row["detail"]).succeeded


def rows_in_view(rows: dict, room: int | None) -> tuple[list, list]:
    """(the rows to draw, in the table's order; the rows left out). All of them where `room` allows
    (or is None), else `room` of them: hosts that failed, then hosts at work, then the hosts done
    last, then the next queued. A terminal shows what fits in it: drawn whole, 300 hosts took 75 ms
    of the laptop's CPU at each of the 8 redraws a second (60 % of a core), 1000 hosts 334 ms
    (bench/laptop_scaling.py); 12-13 ms now at either size."""
    items = list(rows.items())
    if room is None or len(items) <= room:
        return items, []
    def rank(i: int) -> tuple:
        row = items[i][1]
        if row["phase"] == "done":
            return (0, i) if not _done_well(row) else (2, -(row.get("ended") or 0), i)
        return (3, i) if row["phase"] == "queued" else (1, i)
    shown = set(sorted(range(len(items)), key=rank)[:max(room, 1)])
    return [items[i] for i in sorted(shown)], [items[i] for i in range(len(items)) if i not in shown]


def hidden_line(hidden: list) -> str:
    """'250 more hosts: 200 queued, 48 done, 2 at work' for the rows the live table leaves out."""
    by = {"queued": 0, "done": 0, "at work": 0}
    for _, row in hidden:
        by["queued" if row["phase"] == "queued" else "done" if row["phase"] == "done" else "at work"] += 1
    return f"{len(hidden)} more host{'s' if len(hidden) > 1 else ''}: " + ", ".join(
        f"{n} {what}" for what, n in by.items() if n)


# Lines of the live view that are not host rows: title, the table's borders and header, the
# caption, the progress bar, and the line Live keeps for its cursor.
LIVE_FRAME_LINES = 8
# The lines a host takes where the terminal is too narrow for the table (FittedTable.blocks):
# its name and phase, then its stage, time and detail folded.
BLOCK_LINES = 3


class _LiveTable:
    """The live view's table, built from the View's rows whenever rich draws it, with as many
    rows as the terminal has lines for."""

    def __init__(self, view: View):
        self.view = view

    def __rich_console__(self, console, options):
        with self.view.lock:
            yield self.view._render(room=live_room(console), width=options.max_width)


def live_room(console) -> int:
    """How many host rows the live view draws on `console`'s terminal."""
    return max(console.height - LIVE_FRAME_LINES, 3)


# ----------------------------------------------------------------- table columns

# The columns a user reads a table by: never cut on a narrow terminal (the others fold).
WHOLE_COLUMNS = ("host", "status", "reachable", "phase")
# Below this many characters a folded column is no longer readable (a header such as
# "verification" breaks mid-word): then one block per row.
_FOLD_FLOOR = 12


def keep_whole(table: "Table") -> "FittedTable":
    """The table with its WHOLE_COLUMNS never cut: they never wrap and are as wide as
    their widest cell (rich's last resort on a narrow terminal shrinks every column,
    then re-measures each to at least its min_width); the other columns fold their
    text onto more lines instead of ending it in "…". Call it once the rows are added."""
    from rich.cells import cell_len

    for column in table.columns:
        if column.header in WHOLE_COLUMNS:
            column.no_wrap = True
            column.min_width = max([column.min_width or 0, cell_len(str(column.header))]
                                   + [cell_len(str(c)) for c in column.cells])
        else:
            column.overflow = "fold"
    return FittedTable(table)


class FittedTable:
    """A rich renderable: the table when the terminal can show it with its whole
    columns whole and every other column at least _FOLD_FLOOR wide; on a narrower
    terminal, one block per row (its whole columns on the first line, the other
    columns as "header: value" pairs below), so nothing is cut either way."""

    def __init__(self, table: "Table"):
        self.table = table

    def needed_width(self) -> int:
        """What a default-box table needs: its whole columns in full, the others up to
        _FOLD_FLOOR (or their own min_width), each with its padding and border."""
        from rich.cells import cell_len

        need = 1
        for column in self.table.columns:
            widest = max([cell_len(str(column.header))] + [cell_len(str(c)) for c in column.cells])
            floor = widest if column.header in WHOLE_COLUMNS else min(widest, _FOLD_FLOOR)
            need += max(floor, column.min_width or 0) + 3
        return need

    def __rich_console__(self, console, options):
        if self.needed_width() <= options.max_width:
            yield self.table
            return
        yield from self.blocks(console, options.max_width)

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        return Measurement.get(console, options, self.table)

    def blocks(self, console, width: int):
        """The rows as blocks `width` wide. The lines below a row's first are wrapped here, not
        left to the console: the operator's console prints with soft_wrap (nothing of a log line
        is ever cut), under which a padded paragraph would keep only its first line."""
        from rich.text import Text

        table = self.table
        if table.title:
            yield Text(str(table.title), style="italic")
        columns = [(str(c.header), list(c.cells)) for c in table.columns]
        for i, row in enumerate(table.rows):
            whole = [str(cells[i]) if n == 0 else f"{header}: {cells[i]}"
                     for n, (header, cells) in enumerate(columns) if header in WHOLE_COLUMNS]
            rest = [f"{header}: {cells[i]}" for header, cells in columns
                    if header not in WHOLE_COLUMNS and str(cells[i]) not in ("", "-")]
            yield Text("  ".join(whole), style=row.style or "", overflow="fold")
            if rest:
                for line in Text("; ".join(rest)).wrap(console, max(20, width - 2), overflow="fold"):
                    line.rstrip()
                    yield Text("  ") + line
        if table.caption:
            yield Text(str(table.caption), overflow="fold")


# ----------------------------------------------------------------- outcome

def summary_table(task: str, results: dict) -> "FittedTable":
    from rich.table import Table

    table = Table(title=f"fleetpatch {task}: summary")
    for col in ("host", "status", "engine", "patch", "path", "time", "trips"):
        table.add_column(col)
    for name, r in results.items():
        table.add_row(cell(name), cell(r.status), cell(r.engine_version or "-"), cell(r.patch or "-"),
                      cell(r.executed_path or "-"), cell(f"{r.duration_s:.1f}s"), cell(str(r.round_trips)),
                      style="green" if r.ok else "bold red")
    return keep_whole(table)


def last_line(task: str, results: dict, interrupted: bool = False) -> tuple[str, bool]:
    """The run's verdict in one line, with the true count of each outcome.
    Skipped hosts are not failures: they were never touched."""
    n = len(results)
    tally = counts_line(results)
    bad = {h: r for h, r in results.items() if category(r) in ("failed", "unreachable", "interrupted")}
    names = ", ".join(f"{safe_line(h)} ({r.status})" for h, r in bad.items())
    if interrupted:   # even when every host in flight went on to succeed: the run did not do what was asked
        return f"INTERRUPTED: {task} on {plural(n, 'host')}: {tally}" + (f"; not ok: {names}" if names else ""), False
    if all(r.ok for r in results.values()):
        where = f"all {n} hosts" if n != 1 else "its one host"
        return f"OK: {task} succeeded on {where}: {tally}", True
    return (f"FAILED on {len(bad)} of {plural(n, 'host')}: {names} — {tally}; "
            "see the details above for each host's cause and what to do"), False


def print_outcome(console, task: str, results: dict, extra_lines: list[str] = (),
                  interrupted: bool = False) -> None:
    console.print(summary_table(task, results))
    failed = {n: r for n, r in results.items() if not r.ok}
    for name, r in results.items():
        if r.ok and r.message and task in ("check-patch", "fetch"):
            say(console, r.message)
    for name, r in failed.items():
        if category(r) != "skipped":  # never touched: the stopped line and the counts say so, once
            say(console, r.message or f"FAIL {name} {r.status}", style="red")
    print_notes(console, results)
    for line in extra_lines:
        say(console, line)
    text, ok = last_line(task, results, interrupted)
    say(console, text, style="bold green" if ok else "bold red")


def print_notes(console, results: dict) -> None:
    """Each host's notes (a local patch folder that differs from what the host recorded, a restart
    that moved or would move the server to another path), one line each under the host's name:
    the report keeps them without it, the host being their key there."""
    for name, r in results.items():
        for note in r.details.get("notes") or ():
            say(console, f"{name}: note: {note}", style="yellow")


# ----------------------------------------------------------------- JSON report

def check_report_path(path: str | Path | None, flag: str = "--report", directory: bool = False) -> None:
    """Refuse a --report path (or with `directory`, a folder to create) that
    cannot be written, before any host is touched, so a run's results are never
    lost to a typo at the end. It is really tried (root may write where
    `os.access` says yes and the kernel says no, as under /proc): a file is made
    and removed in the deepest folder of the path that exists. No folder is
    made here, so runs started together in one folder cannot remove each
    other's (a --dest folder is made when the run writes). A report's folder
    must exist: a typo in it would otherwise make folders where none belong."""
    if not path:
        return
    p = Path(path)
    if p.is_dir() and not directory:
        raise UsageError(f"{flag} {path}: is a directory; give a file path, e.g. {p / 'report.json'}")
    if p.exists() and directory and not p.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a directory")
    base = p if directory else p.parent
    if not directory and not base.exists() and not any(d.is_file() for d in base.parents):
        raise UsageError(f"{flag} {path}: the folder {base} does not exist; make it first "
                         f"(mkdir -p {shlex.quote(str(base))}) or give a path in a folder that exists")
    while not base.exists() and base != base.parent:
        base = base.parent
    for d in [base, *base.parents]:
        if not d.is_dir():
            raise UsageError(f"{flag} {path}: {d} is a file, not a directory")
    try:
        if p.exists() and not directory:
            with open(p, "ab"):
                pass
        else:
            import tempfile

            fd, probe = tempfile.mkstemp(prefix=".fleetpatch-write-test-", dir=str(base))
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write there: {e.strerror or e}") from None


def write_report(path: str | Path, task: str, ok: bool, started: str, results: dict, extra: dict | None = None) -> None:
    doc = {"task": task, "ok": ok, "started": started, "finished": now_iso(), "counts": counts(results),
           "hosts": {name: redact.data(r.to_json()) for name, r in results.items()}}
    if extra:
        doc.update(redact.data(dict(extra)))
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")


# ----------------------------------------------------------------- status

def last_verification(last: dict, restart_pending: bool = False) -> str:
    """The last verdict and what it was of: which check (after a deploy the markers must
    be seen, after a rollback they must be gone; or a verify-logs), of which patches.
    With a restart pending the files changed after it: it is not a verdict on them."""
    if not last:
        return "none since the change (restart pending)" if restart_pending else "-"
    labels = ", ".join(str(l) for l in last.get("labels") or []) or "?"
    check = last.get("check")
    what = f"{check} check of {labels}" if check else f"check of {labels}"
    said = f"{last.get('status', '?')}: {what}, {last.get('at', '?')}"
    return f"none since the change (restart pending); before it: {said}" if restart_pending else said


def status_table(results: dict) -> "FittedTable":
    from rich.table import Table

    table = Table(title="fleetpatch status")
    for col in ("host", "reachable", "engine", "patches applied", "drift", "server up", "last verification",
                "lock"):
        table.add_column(col)
    for name, r in results.items():
        d = r.details
        shown = name if d.get("node_group") is None else f"{name} ({d['node_group']} rank {d['node_rank']})"
        if not d.get("reachable"):
            table.add_row(cell(shown), cell(f"no ({r.status})"), "-", "-", "-", "-", "-", "-", style="bold red")
            continue
        table.add_row(
            cell(shown), "yes",
            cell((r.engine_version or "?") + ("" if d.get("known_version", True) else " (unknown to profile)")),
            cell(", ".join(str(a) for a in d.get("applied") or []) or "-"),
            cell(", ".join(str(p).rsplit("/", 1)[-1] for p in d.get("drift") or []) or "no"),
            cell(("yes" if d.get("server_up") else "NO") + (" (restart pending)" if d.get("restart_pending") else "")),
            cell(last_verification(d.get("last_verification") or {}, bool(d.get("restart_pending")))
                 if not d.get("servers") else "per server:"),
            cell((d.get("lock_state") or {}).get("cell") or "-"),
            style="" if r.ok else "bold red")
        for server, s in (d.get("servers") or {}).items():   # several servers on the host: one row each
            table.add_row(cell(f"  {name} [{server}]"), "", "", "", "",
                          cell(("yes" if s.get("server_up") else "NO")
                               + (" (restart pending)" if s.get("restart_pending") else "")),
                          cell(last_verification(s.get("last_verification") or {},
                                                 bool(s.get("restart_pending")))), "")
    return keep_whole(table)


# ----------------------------------------------------------------- -v: the evidence

def _launch_text(launch: dict) -> str:
    env = " ".join(f"{k}={v}" for k, v in sorted((launch.get("env") or {}).items()))
    argv = " ".join(launch.get("argv") or []) or "(not known)"
    return f"{argv}" + (f"  env: {env}" if env else "") + f"  ({launch.get('source', '?')} launch config)"


def evidence_lines(r) -> list[str]:
    """One host's evidence as -v prints it: what decided the path, where it was seen
    (log line numbers), the markers seen, and the server facts the verdict read."""
    d = r.details or {}
    out = [f"{r.host}: {r.status}" + (f", path {r.executed_path}" if r.executed_path else "")
           + (f" ({r.patch})" if r.patch else "")]
    if d.get("cause"):
        out.append(f"  cause: {d['cause']}")
    for ev in d.get("evidence") or []:
        where = f"log line {ev['line_no']}" if ev.get("line_no") else ev.get("source", "?")
        out.append(f"  {where}: {ev.get('text', '')}")
    for m in r.markers or []:
        where = f"log line {m['line_no']}" if m.get("line_no") else "log"
        out.append(f"  marker {m.get('path', '')} at {where}: {m.get('text', '')}")
    facts = redact.data(d.get("server_facts") or {})   # whole, before a long one is cut short
    if facts.get("launch"):
        out.append(f"  launch: {_launch_text(facts['launch'])}")
    if facts.get("server_info") is not None:
        info = json.dumps(facts["server_info"], sort_keys=True)
        out.append(f"  /server_info: {info if len(info) <= 400 else info[:400] + ' …'}")
    if d.get("patches"):
        out.append(f"  patches recorded on the host: {', '.join(d['patches'])}")
    if len(out) == 1:
        out.append("  no evidence: no log was read for this host (" + (r.message.splitlines() or [""])[0] + ")")
    return out


def print_evidence(console, results: dict) -> None:
    for r in results.values():
        say(console, "\n".join(evidence_lines(r)))
