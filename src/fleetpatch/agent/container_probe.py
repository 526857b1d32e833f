"""The probe on a container host: it goes into the interpreter INSIDE the container,
while the agent that puts it there runs on the host (container.py says why).

- Its ``.pth`` goes into the site directory where the container's python finds the
  engine package (`container.package_site`): the interpreter that imports the package
  from there reads that directory's ``.pth`` files at every start. Found from the host,
  like the package: no ``docker exec``.
- Its probe dir (runtime, plan, records) is `PROBE_DIR` inside the container, in the
  container's own writable layer: the server writes its records there whatever user it
  runs as, and they survive ``docker stop``/``start`` (restart.kind container), so they
  stay until fleetpatch's next restart of the server, for verify-logs. /var/tmp, not
  /tmp: an image may mount a tmpfs on /tmp, which a stop empties.
- The host reaches both through ``/proc/<main pid>/root``, and the main pid changes at
  every restart of the container: what is kept between requests (the session's probe,
  the INSTALLED note) is the container path, made a host path from the root of the
  moment (`root_now`). A symlink on the way is refused: an absolute link in the
  container's tree would lead the host's writes out of it, into the host's own files.
- The records name pids of the container's pid namespace; the follow names the server
  and its children in that namespace too (`inner_pid`), so the verdict compares like
  with like, an exited scheduler included.
"""
import os
import re
import sys
import time

from . import inroot
from .base import AgentError, protocol
from .container import describe, inspect, package_site, site_dirs, spec_of

if __name__.split(".")[0] == "fleetpatch":   # imported on the laptop (tests)
    from ..probe import install as probe_install
else:                                        # on a host: agentboot loaded it from stdin, before this
    probe_install = sys.modules[protocol.PROBE_MODULE_NAME]

PROBE_DIR = "/var/tmp/fleetpatch-probe"
PID_NAMESPACE = "container"   # what the follow's probe events say of their pids
SETTLE_TRIES, SETTLE_S = 15, 0.2   # a container whose main process just ended: until the runtime says it stopped


def root_now(req, stopped=False):
    """The container's root as the host sees it at this moment, or None (stopped, gone,
    the runtime not answering). `req`: a request (resolved by container.attach or not)
    or a note that names the container. Never raises: taking the probe out must not fail.

    `stopped`: for a stopped container, the writable layer of its overlay2 filesystem
    (GraphDriver.Data.UpperDir), which holds every file written into the container: the
    probe's .pth comes out of a container that stopped before the verdict, so that its
    next start (by anyone) loads no probe."""
    info = req.get("_container")
    if info and info.get("root"):
        return info["root"]
    name, runtime = spec_of(req)
    if not name:
        return None
    for _ in range(SETTLE_TRIES):
        try:
            doc = inspect(name, runtime)
        except AgentError:
            return None
        now = describe(doc, name, runtime)
        if not now["running"]:
            return writable_layer(doc) if stopped else None
        if os.path.isdir(now["root"]):
            return now["root"]
        time.sleep(SETTLE_S)   # its main process is gone and the runtime does not say so yet
    return None


def writable_layer(doc):
    """The upper directory of a stopped container's overlay filesystem (Docker's overlay2,
    Podman's overlay), None for another driver."""
    driver = doc.get("GraphDriver") or {}
    upper = (driver.get("Data") or {}).get("UpperDir") if driver.get("Name") in ("overlay2", "overlay") else None
    return upper if upper and os.path.isdir(upper) else None


def no_links(root, inside):
    """root + inside, resolved in the container's root (inroot) with no symlink on the way
    (the last component may be absent)."""
    try:
        return inroot.host_path(root, inside, refuse_links=True)
    except AgentError as e:
        raise probe_install.ProbeInstallError("the probe is not put through it: %s" % e.message)


def host_dir(req):
    """PROBE_DIR as a host path now (None: the container's root cannot be reached, or a
    symlink is on the way to it)."""
    root = root_now(req)
    if not root:
        return None
    try:
        return no_links(root, PROBE_DIR)
    except (probe_install.ProbeInstallError, OSError):
        return None


def clear_records(req):
    """The last restart's probe dir goes (its records with it): a restart starts a new window."""
    root = root_now(req)
    if root is None:
        return
    try:
        path = no_links(root, os.path.dirname(PROBE_DIR)) + "/" + os.path.basename(PROBE_DIR)
    except (probe_install.ProbeInstallError, OSError):
        return
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        import shutil   # here: a container's probe removal only; shutil brings bz2 and lzma (2.6 ms at a start)

        shutil.rmtree(path, ignore_errors=True)


def placement(req, token):
    """Where this run's probe goes in the container (its root resolved by container.attach):
    (the INSTALLED note, in container paths; the site dir and the probe dir as host paths).
    Raises ProbeInstallError."""
    info = req["_container"]
    root = info["root"]
    found = package_site(req, req.get("package") or "")
    if not found:
        raise probe_install.ProbeInstallError("the container's python has no site directory holding %s (%s)"
                                              % (req.get("package"), ", ".join(site_dirs(root, (req.get("container") or {}).get("python")))
                                                 or "none"))
    site = found[0]
    note = {"site_dir": site, "token": token, "container": {"name": info["name"], "runtime": info["runtime"]}}
    return note, no_links(root, site), no_links(root, PROBE_DIR)


def version_of(site):
    """'3.13' from a site dir such as /usr/local/lib/python3.13/dist-packages ('' when it names none)."""
    m = re.search(r"/python(\d+\.\d+)/", site + "/")
    return m.group(1) if m else ""


def site_on_host(req, note):
    """The host path of the container site dir that `note` names, to take a probe out of
    (None: not reachable now; the next run's lock takes it out)."""
    root = root_now(req, stopped=True)
    if not root:
        return None
    try:
        return no_links(root, note["site_dir"])
    except (probe_install.ProbeInstallError, OSError):
        return None


def inner_pid(pid):
    """The pid that host pid `pid` has in its own (innermost) pid namespace, from the
    NSpid line of /proc/PID/status (Linux 4.1+); None when it is gone or says none."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (IOError, OSError, ValueError, IndexError):
        return None
    return None


def inside_view(ev, children):
    """The follow's probe event with the server and its children named in the container's
    pid namespace, as the records name them; the host's pid of the server beside them."""
    pid = ev.get("pid")
    if not pid:
        return ev
    inner = [inner_pid(p) for p in children]
    return dict(ev, pid=inner_pid(pid), host_pid=pid, children=sorted(p for p in inner if p),
                pid_namespace=PID_NAMESPACE)
