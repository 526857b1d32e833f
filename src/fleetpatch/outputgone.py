"""When nobody can read the program's output any more: the reader of its pipe went away
(`fleetpatch … | head`) or its terminal hung up. The rest of the output goes to /dev/null, so that
no later write or flush raises where a host's step or the run's report is still to be done."""
import os


def to_devnull(*fds: int) -> None:
    """Point each fd at /dev/null (best effort: it may be closed already)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in fds:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)
