"""`python -m fleetpatch` and the `fleetpatch` console script."""
import sys


def entry() -> None:
    """The program, with a Ctrl-C while it still loads (its first half second) ending as any
    other interrupt does: one line, exit 130, no traceback; nothing has been done yet."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("fleetpatch: interrupted while starting; nothing was done", file=sys.stderr)
        sys.exit(130)
    main()


if __name__ == "__main__":
    entry()
