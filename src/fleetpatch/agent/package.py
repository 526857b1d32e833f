"""Where the engine's package is on this host and which version it is, as the
engine's own interpreter sees it (its site step run only when needed)."""
import os
import sys

from .base import AgentError, read_bytes


def site_pending():
    """Started with -S and the site step not run since."""
    return bool(sys.flags.no_site) and "site" not in sys.modules


def with_site():
    """The interpreter's whole `site` step (site-packages, every .pth file), once.

    The agent starts with -S: the site step is a third of a bare start-up (more
    where a .pth file imports something), and the agent itself needs only the
    stdlib. What must see the modules the host's Python sees asks for it here."""
    if site_pending():
        import importlib
        import site

        site.main()
        importlib.invalidate_caches()


def find_spec(name):
    """importlib's spec of `name` as the engine's interpreter, site step and all, finds it.

    Without the site step sys.path is the stdlib and PYTHONPATH, which come before
    site-packages anyway: a module found there is the one a full start finds too,
    so the site step runs only when the module is not there."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except ImportError:   # a dotted name's parent package is not found either
        if not site_pending():
            raise
        spec = None
    if spec is None and site_pending():
        with_site()
        spec = importlib.util.find_spec(name)
    return spec


def package_dir(package):
    """The directory that holds the engine package, found without importing it."""
    spec = find_spec(package)
    if spec is None or not spec.origin:
        raise AgentError("error", "%s cannot import %s: is engine.python the interpreter that runs the engine?"
                         % (sys.executable, package))
    pkg = os.path.dirname(os.path.abspath(spec.origin))
    return os.path.dirname(pkg)


def dist_info_version(root, package, read=None):
    """The version in the one `<package>-*.dist-info/METADATA` beside the package, or
    None (none, several, unreadable). The distribution installed with the package
    that imports is the one that counts, and reading it costs no importlib.metadata
    (tens of ms of imports at every agent start). `read(path)`: the file's bytes (a
    container's: resolved in its root)."""
    prefix = package.replace("-", "_").lower() + "-"
    try:
        found = [n for n in os.listdir(root) if n.lower().startswith(prefix) and n.endswith(".dist-info")]
    except OSError:
        return None
    if len(found) != 1:
        return None
    try:
        data = (read or read_bytes)(os.path.join(root, found[0], "METADATA"))
    except (IOError, OSError, AgentError):
        return None
    for raw in data.split(b"\n"):
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if not line:
            break  # the end of the headers
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip() or None
    return None


def package_version(package, root=None):
    found = dist_info_version(root, package) if root else None
    if found:
        return found
    with_site()
    try:
        import importlib.metadata as md
    except ImportError:  # Python 3.7
        return None
    try:
        return md.version(package)
    except Exception:
        return None
