"""Where the engine's package is on this host and which version it is, as the
engine's own interpreter sees it (its site step run only when needed)."""
import hashlib
import json
import os
import re
import sys

from .base import AgentError, atomic_write, read_bytes, read_json

PACKAGE_CACHE = "package-cache.json"   # in the state dir: where the site step found each package, keyed by site_inputs
PACKAGE_CACHE_MOST = 16
CUSTOMIZE = ("sitecustomize.py", "usercustomize.py")   # imported by the site step from anywhere on sys.path


def site_pending():
    """Started with -S and the site step not run since. (`site` imported without its
    main() run, as site_inputs does, leaves ENABLE_USER_SITE at None.)"""
    site = sys.modules.get("site")
    return bool(sys.flags.no_site) and getattr(site, "ENABLE_USER_SITE", None) is None


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


def find_spec(name, site=True):
    """importlib's spec of `name` as the engine's interpreter, site step and all, finds it
    (`site`=False: as it is now, the site step not run for it).

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
    if spec is None and site and site_pending():
        with_site()
        spec = importlib.util.find_spec(name)
    return spec


def stat_of(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def pth_dirs(site_dir, name):
    """The stat of each directory a .pth file adds to sys.path (a package created in one
    since, ahead of the kept answer's, would be found first), in its order."""
    if not name.endswith(".pth"):
        return []
    try:
        lines = read_bytes(os.path.join(site_dir, name)).decode("utf-8", "replace").splitlines()
    except (IOError, OSError, AgentError):
        return [None]
    return [[line, stat_of(os.path.join(site_dir, line.rstrip()))] for line in lines
            if line.strip() and not line.startswith(("#", "import ", "import\t"))]


def site_inputs(package):
    """A digest of everything the site step's answer for `package` depends on, read without
    running it: the interpreter and its pyvenv.cfg, the environment that steers `site`
    (PYTHON*, HOME), sys.path before it (package_dir searched it already: only a
    sitecustomize there counts), and every directory whose .pth files it would run
    (site-packages, the user site), each with its own stat and every .pth file's and
    sitecustomize's in it. Installing, removing or editing a package there (pip writes its
    dist-info, an editable install its .pth) changes the digest: the step runs again."""
    import site   # under -S: its functions only, main() is not run

    prefixes = []
    for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):   # a venv that sees the system's too
        if p not in prefixes:
            prefixes.append(p)
    dirs = list(site.getsitepackages(prefixes))
    if site.check_enableusersite():
        dirs.append(site.getusersitepackages())
    exe = sys.executable
    parts = [package, exe, stat_of(exe), stat_of(os.path.realpath(exe)), prefixes, sys.path,
             [stat_of(os.path.join(d, "pyvenv.cfg")) for d in (os.path.dirname(exe), os.path.dirname(os.path.dirname(exe)))],
             sorted((k, v) for k, v in os.environ.items() if k.startswith("PYTHON") or k == "HOME")]
    for d in dirs:   # a package installed here since would be found before an editable's path
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".pth") or n in CUSTOMIZE)
        except OSError:
            parts.append([d, None])
            continue
        parts.append([d, stat_of(d)] + [[n, stat_of(os.path.join(d, n))] + pth_dirs(d, n) for n in names])
    for d in sys.path:   # searched before the step (package_dir did): only the customize modules count
        parts.append([d] + [[n, stat_of(os.path.join(d, n))] for n in CUSTOMIZE])
    return hashlib.sha256(json.dumps(parts).encode("utf-8", "surrogateescape")).hexdigest()


def origin_after_site(package, cache_path):
    """spec.origin of `package` as the site step finds it, from the state dir's cache when what
    the step reads is unchanged since it last ran (site_inputs) and the file is still there:
    the step runs every .pth of the engine's Python (30 ms of CPU on the test hosts, more on an
    engine's venv), at every deploy, for an answer that changes only when those do."""
    cache = read_json(cache_path) if cache_path else None
    cache = cache if isinstance(cache, dict) else {}
    key = site_inputs(package) if cache_path else None
    origin = cache.get(key)
    if isinstance(origin, str) and os.path.isfile(origin):
        return origin
    with_site()
    spec = find_spec(package)
    origin = spec.origin if spec is not None else None
    if cache_path and origin and os.path.isfile(origin):
        cache = dict(list((k, v) for k, v in cache.items() if k != key)[-(PACKAGE_CACHE_MOST - 1):], **{key: origin})
        try:
            atomic_write(cache_path, json.dumps(cache).encode("utf-8", "surrogateescape"))
        except OSError:   # a cache that cannot be written costs the next run the site step, nothing else
            pass
    return origin


def package_dir(package, cache_path=None):
    """The directory that holds the engine package, found without importing it.
    `cache_path`: the state dir's PACKAGE_CACHE, or None (the site step runs when needed)."""
    spec = find_spec(package, site=False)
    origin = spec.origin if spec is not None else None
    if spec is None and site_pending():
        origin = origin_after_site(package, cache_path)
    if not origin:
        raise AgentError("error", "%s cannot import %s: is engine.python the interpreter that runs the engine?"
                         % (sys.executable, package))
    pkg = os.path.dirname(os.path.abspath(origin))
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
