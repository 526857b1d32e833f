"""`invoke <command>` in the repo runs the same tasks as the installed `fleetpatch` program."""
from fleetpatch.cli import ns  # noqa: F401
