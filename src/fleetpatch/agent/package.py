"""Where the engine's package is on this host and which version it is, as the
engine's own interpreter sees it (its site step run only when needed)."""
import os
import re
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


VERSION_ASSIGN = (r"""^(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:(?:__version__|version)\s*=\s*)?"""
                  r"""(['"])([^'"]+)\1\s*$""")


def version_in_source(data):
    """The version a `_version.py` / `version.py` states (`__version__ = version = '0.33.0'` as
    setuptools-scm writes it, or `__version__ = "0.5.9"`), or None. Pure: bytes in."""
    m = re.search(VERSION_ASSIGN, data.decode("utf-8", "replace"), re.M)
    return m.group(2) if m else None


def file_version(root, version_file, read=None):
    """The version in the profile's `version_file` inside `root` (None: no such file, or it says none)."""
    if not root or not version_file:
        return None
    try:
        return version_in_source((read or read_bytes)(os.path.join(root, version_file)))
    except (IOError, OSError, AgentError):
        return None


def package_version(package, root=None, version_file=None):
    """The dist-info's version, else the profile's version file's (a source tree on sys.path has no
    dist-info beside it), else importlib.metadata's; None when nothing says."""
    found = (dist_info_version(root, package) or file_version(root, version_file)) if root else None
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
