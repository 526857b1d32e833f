"""One interpreter start on a probed tree, as a server's start is: `root`/site is a site dir (the
probe's .pth goes there), `root`/mods is on sys.path, and `body` runs after that (it imports the
watched module). The start must succeed; its stdout is returned."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SITE_AND_MODS = "import site, sys\nsite.addsitedir(sys.argv[1] + '/site')\nsys.path.insert(0, sys.argv[1] + '/mods')\n"


def probed_start(root: Path, body: str, write_bytecode: bool = False) -> str:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run([sys.executable, "-S", "-c", SITE_AND_MODS + body, str(root)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout
