"""The one place the commands are collected, and the `fleetpatch` Program:
`invoke deploy-patch …` in the repo and `fleetpatch deploy-patch …` anywhere
are the same command.

The Program reads the command line once before Invoke does, so that a person
gets help whenever they ask for it, an unknown flag named with a suggestion,
and one line with exit 2 for any mistake, never a traceback.
"""
from __future__ import annotations

import inspect
import sys

from invoke import Collection, Program
from invoke.exceptions import ParseError

from . import __version__, cli_fleet, cli_hosts
from .cli_common import METAVAR, column_lines, err_line, help_width, interrupted_line, usage_line, wrapped
from .errors import EXIT_INTERRUPTED, EXIT_USAGE

ns = Collection(*cli_hosts.TASKS, *cli_fleet.TASKS)

# The only options of the program itself; Invoke's others (--pty, --dry, ...)
# do nothing useful for fleetpatch and are neither shown nor accepted.
CORE_FLAGS = {"--help": False, "-h": False, "--version": False, "-V": False, "--list": False, "-l": False}
HELP_FLAGS = ("--help", "-h")


class UsageProblem(Exception):
    pass


def edits(a: str, b: str) -> int:
    """Letters to add, drop, change or swap to turn `a` into `b` (optimal string alignment)."""
    prev2, prev = [], list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def _suggest(word: str, choices) -> str:
    """Every choice nearest to a typo, when one is a slip of a letter or two (`--patchs`: --patch
    and --patches, one letter each: the user may mean either); else difflib's nearest, or a prefix."""
    choices = list(choices)
    distance = {c: edits(word, c) for c in choices}
    nearest = min(distance.values(), default=0)
    if choices and 0 < nearest <= len(word.lstrip("-")) // 3:
        close = sorted((c for c in choices if distance[c] == nearest), key=lambda c: (len(c), c))[:3]
    else:
        import difflib   # only for a mistake: not at every start
        close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
        if not close:
            close = [c for c in choices if c.startswith(word) or word.startswith(c)][:1]
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def task_flags(name: str) -> dict[str, bool]:
    """--flag -> whether it takes a value, for one command."""
    flags = {}
    for arg in ns[name].get_arguments():
        for n in arg.names:
            flags[("-" if len(n) == 1 else "--") + n.replace("_", "-")] = arg.takes_value
    return flags


def normalize(argv: list[str]) -> tuple[list[str], str | None]:
    """Check argv (without the program name) against the commands and their
    flags; returns it with every value joined to its flag (`--canary=-1`, so a
    negative number is a value, not a flag) and the command's name, or raises
    UsageProblem with the one line to show."""
    out: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if flag not in CORE_FLAGS:
            raise UsageProblem(f"unknown option {flag}{_suggest(flag, [f for f in CORE_FLAGS if f.startswith('--')])};"
                               " see fleetpatch --help")
        out.append(flag)
        i += 1
    if i == len(argv):
        return out, None
    name = argv[i]
    if name not in ns.task_names:
        raise UsageProblem(f"unknown command {name!r}{_suggest(name, ns.task_names)}; "
                           f"commands: {', '.join(sorted(ns.task_names))}")
    rest = argv[i + 1:]
    if any(a in HELP_FLAGS for a in rest) or any(a in HELP_FLAGS for a in out):
        return ["--help", name], name
    out.append(name)
    flags = task_flags(name)
    j = 0
    while j < len(rest):
        tok = rest[j]
        if not tok.startswith("-"):
            what = "one command at a time" if tok in ns.task_names else "flags take their value as --flag VALUE"
            raise UsageProblem(f"{name}: unexpected argument {tok!r} ({what}); see fleetpatch {name} --help")
        flag, eq, value = tok.partition("=")
        if flag not in flags:
            raise UsageProblem(f"{name}: unknown option {flag}{_suggest(flag, flags)}; "
                               f"see fleetpatch {name} --help")
        if not flags[flag]:
            if eq:
                raise UsageProblem(f"{name}: {flag} takes no value (got {tok!r})")
            out.append(flag)
            j += 1
            continue
        if not eq:
            if j + 1 >= len(rest):
                meta = METAVAR.get(flag[2:].replace("-", "_"), "VALUE")
                raise UsageProblem(f"{name}: {flag} needs a value: {flag} {meta}")
            value = rest[j + 1]
            j += 1
        out.append(f"{flag}={value}")
        j += 1
    return out, name


class FleetpatchProgram(Program):
    """Help always works, unknown flags are named, usage errors exit 2 with one
    line, Ctrl-C exits 130."""

    def run(self, argv=None, exit=True):
        args = sys.argv if argv is None else (argv.split() if isinstance(argv, str) else list(argv))
        try:
            fixed, _ = normalize(args[1:])
        except UsageProblem as e:
            err_line(str(e))
            sys.exit(EXIT_USAGE)
        try:
            return super().run([args[0] if args else "fleetpatch", *fixed], exit)
        except KeyboardInterrupt as e:
            print(interrupted_line(e), file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)

    def parse_core(self, argv):
        try:
            return super().parse_core(argv)
        except ParseError as e:
            err_line(str(e))
            sys.exit(EXIT_USAGE)

    def parse_tasks(self):
        try:
            return super().parse_tasks()
        except ParseError as e:
            err_line(str(e))
            sys.exit(EXIT_USAGE)

    def print_help(self) -> None:
        head = f"Usage: {self.binary} "
        lines = wrapped("[--help] [--version] [--list] <command> [--options]", help_width(), " " * len(head))
        print("\n".join([head + lines[0][len(head):], *lines[1:]]))
        print(f"       {self.binary} <command> --help")
        print("")
        print("Options:")
        print("")
        self.print_columns([
            ("-h, --help", "Show this help; `fleetpatch <command> --help` shows a command's help."),
            ("-V, --version", "Show fleetpatch's version."),
            ("-l, --list", "List the commands."),
        ])
        self.list_tasks()

    def print_task_help(self, name: str) -> None:
        ctx = self.parser.contexts[name]
        tuples = []
        for spec, text in ctx.help_tuples():
            flag = spec.split("=")[0].split()[0].rstrip(",")
            meta = METAVAR.get(flag.lstrip("-").replace("-", "_"))
            if meta:
                spec = spec.replace("=STRING", f"={meta}").replace("=INT", f"={meta}")
            tuples.append((spec, text))
        print(usage_line(self.binary, name))
        print("")
        for line in (inspect.getdoc(self.collection[name]) or "").splitlines():
            print("\n".join(wrapped(line, help_width(), self.leading_indent)) if line.strip() else "")
        print("")
        print("Options:")
        self.print_columns(tuples)

    def print_columns(self, tuples) -> None:
        # Wrapped to the terminal, or to 80 columns piped (a pager, a CI log): never a 200-column line.
        print("\n".join(column_lines(tuples, help_width(), self.leading_indent, self.col_padding)))
        print("")


program = FleetpatchProgram(namespace=ns, name="fleetpatch", binary="fleetpatch", version=__version__)


def main():
    try:
        program.run()
        code = 0
    except SystemExit as e:
        code = e.code
    except BrokenPipeError:
        code = 1
        _stdout_to_devnull()
    sys.exit(_flushed(code))


def _stdout_to_devnull() -> None:
    # the reader went away (`fleetpatch --help | head`): no traceback; stdout goes
    # nowhere so that no later flush can raise again
    from .outputgone import to_devnull
    to_devnull(sys.stdout.fileno())


def _flushed(code):
    """The exit code, once the output is out: a reader that went away during the
    last flush makes it 1 (if it was 0) and no "Exception ignored" at exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            _stdout_to_devnull()
            code = code or 1
        except (OSError, ValueError):
            pass
    return code
