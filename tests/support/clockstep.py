"""A host whose wall clock can be stepped: libfaketime preloaded into the host's python.

The engine python of a local host becomes a wrapper that preloads libfaketime with
FAKETIME_DONT_FAKE_MONOTONIC=1 and a timestamp file read on every call, so writing
"+3600" into that file steps CLOCK_REALTIME of the running agent (and of the server
it starts) by an hour at once, while CLOCK_MONOTONIC keeps going as on a host whose
clock NTP or an operator steps. Only these processes see the step: the machine's
clock is shared with everyone else and is not touched.

libfaketime 0.9.10 (Debian 12) fails every clock_nanosleep with EINVAL under
FAKETIME_DONT_FAKE_MONOTONIC, so Python's time.sleep would raise; a four-line
preload put before it passes clock_nanosleep straight to the kernel (sleeping
is not what is faked here; the realtime clock is).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

LIBFAKETIME = next((p for p in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/faketime/libfaketime.so.1") if os.path.exists(p)), None)

MISSING = (None if LIBFAKETIME and shutil.which("gcc") else
           "needs libfaketime (apt-get install libfaketime) and gcc to step the host's clock")

SLEEP_SHIM = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
    return syscall(SYS_clock_nanosleep, clock, flags, req, rem) == 0 ? 0 : errno;
}
"""


def build_shim(directory: Path) -> Path:
    so = directory / "realsleep.so"
    if not so.exists():
        src = directory / "realsleep.c"
        src.write_text(SLEEP_SHIM)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(so), str(src)], check=True,
                       capture_output=True)
    return so


class Clock:
    """The stepped clock of one host: `step(s)` moves its wall clock by s seconds from real time."""

    def __init__(self, root: Path, python: Path, shim: Path):
        self.file = root / "faketime"
        self.file.write_text("+0\n")
        self.python = root / "python-faketime"
        self.python.write_text("#!/bin/sh\n"
                               f"export LD_PRELOAD='{shim} {LIBFAKETIME}'\n"
                               "export FAKETIME_DONT_FAKE_MONOTONIC=1 FAKETIME_NO_CACHE=1\n"
                               f"export FAKETIME_TIMESTAMP_FILE='{self.file}'\n"
                               f"exec '{python}' \"$@\"\n")
        self.python.chmod(0o755)

    def step(self, seconds: int) -> None:
        tmp = self.file.with_name("faketime.new")
        tmp.write_text(f"{seconds:+d}\n")
        os.replace(tmp, self.file)   # a reader sees the old offset or the new one, never half

    def now_offset(self) -> float:
        """What the wrapped python's time.time() says minus the real one."""
        out = subprocess.run([str(self.python), "-c", "import time, sys; sys.stdout.write(repr(time.time()))"],
                             capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]})
        import time
        return float(out.stdout) - time.time()
