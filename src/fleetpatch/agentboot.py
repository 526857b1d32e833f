"""Stage two of the agent's start on a host: load the sent sources, through a compile cache.

The SSH command line carries only stage one (`remote.BOOTSTRAP`): it reads an
8-digit length and that many bytes of this file (zlib), and runs it with fd 0
untouched beyond what it read. This stage then reads, all from fd 0 with exact
reads (nothing is buffered ahead, so the agent's request loop owns the rest of
the stream):

    8-digit length, header JSON, zlib'd   {"cache_dir": ..., "cache_key": HEX, "run": NAME, "compressed": N,
                                          "modules": [{"name", "filename", "sha256", "size"}, ...]}
    N bytes: the sources of all modules, one after the other (`size` bytes each), as
    one zlib stream (one stream, not one per module: 15 % fewer bytes on the wire)

Every source is sent every time, so the host never runs code the laptop did
not send. The cache only saves the compile: an entry is keyed by the sha256 of
the sent source, the interpreter's exact version and the laptop's cache key, and
holds an HMAC of (that sha256, the interpreter, its marshal bytes) under the
laptop's key (`cache_key`, a secret the laptop keeps and sends on the SSH channel
only). The agent runs as root: whoever can write the cache must not get code run,
so a hash the entry declares for itself proves nothing; the HMAC only the laptop's
key makes does. The cache directory and each entry must also be this user's (root's)
and not group- or world-writable, opened without following a symlink; anything else
(absent, torn, corrupt, another interpreter's or laptop's, planted) falls back to
compiling the sent source, and rewrites the entry atomically (its temp file created
O_EXCL|O_NOFOLLOW). A cache that cannot be written (read-only state dir) or trusted
costs the compile and nothing else.

Every module is run and registered in sys.modules under its name, in the order
sent (the laptop sends each after the modules it imports). A dotted name
(`fleetpatch_agent.lock`) is a module of a package that has no files here: the
package is made empty (no code of its own, and nothing to find on disk), so
the agent's modules import each other relatively, as they do on the laptop,
where they are `fleetpatch.agent.*`. Then `serve(0, how each was loaded)` of
the module named `run` is the agent's request loop: it reads requests from fd 0
until the laptop says `bye` or closes the channel.

Stdlib only, Python 3.8+.
"""
import atexit
import gc
import hashlib
import hmac
import json
import marshal
import os
import stat
import sys
import types
import zlib

MAGIC = b"fleetpatch-agent-cache 2\n"
KEEP_ENTRIES = 48      # other agent versions' entries (one per module) beyond this many are pruned, oldest first


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.stderr.write("fleetpatch agent: the laptop closed the channel while sending the agent\n")
            os._exit(3)
        data += chunk
    return data


def read_block():
    return read_exact(int(read_exact(8)))


def interpreter_tag():
    return "%s %s" % (sys.implementation.cache_tag, sys.version)


def entry_path(cache_dir, source_sha, filename, key):
    tag = "%s\0%s\0%s\0%s" % (source_sha, filename, interpreter_tag(), hashlib.sha256(key).hexdigest())
    return os.path.join(cache_dir, hashlib.sha256(tag.encode()).hexdigest() + ".code")


def seal(key, source_sha, body):
    """The entry's HMAC: only the laptop's key makes it, so a planted entry cannot."""
    return hmac.new(key, ("%s\0%s\0" % (source_sha, interpreter_tag())).encode() + body, hashlib.sha256).hexdigest()


def trusted(st):
    """Only this user (root) can have written it: ours, and not group- or world-writable."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def trusted_dir(path):
    """The cache directory, as a directory of ours nobody else may write (one of ours that
    others could is made 0700 first: its entries are checked one by one anyway); None when
    it is not ours (a link, another user's): then nothing is read from it nor written into it."""
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o022:
            os.chmod(path, 0o700)
            st = os.lstat(path)
    except OSError:
        return path    # absent: store() makes it, 0700
    return path if stat.S_ISDIR(st.st_mode) and trusted(st) else None


def load_cached(path, source_sha, key):
    """The cached code object, or None unless the entry proves it is this source's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (IOError, OSError):
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not trusted(st):
            return None
        data = f.read()
    if not data.startswith(MAGIC):
        return None
    head, sep, body = data[len(MAGIC):].partition(b"\n\n")
    if not sep:
        return None
    fields = dict(line.split(" ", 1) for line in head.decode("ascii", "replace").splitlines() if " " in line)
    if not hmac.compare_digest(fields.get("seal", "").encode("utf-8"), seal(key, source_sha, body).encode()):
        return None
    try:
        code = marshal.loads(body)
    except (ValueError, EOFError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


def store(path, source_sha, code, keep, key):
    """Write the entry beside its final name and rename it over: a reader sees all of it or nothing.
    The temp file is created, never opened: a link planted at its name is not followed."""
    body = marshal.dumps(code)
    head = "source %s\npython %s\nseal %s\n\n" % (source_sha, interpreter_tag(), seal(key, source_sha, body))
    directory = os.path.dirname(path)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = None
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + head.encode("ascii") + body)
        os.rename(tmp, path)
        prune(directory, keep)
    except (IOError, OSError):
        if fd is not None:   # ours: a name we did not create (EEXIST) is left alone
            try:
                os.unlink(tmp)
            except OSError:
                pass


def prune(directory, keep):
    """Remove the oldest entries beyond KEEP_ENTRIES, never one of `keep` (this agent's)."""
    entries = []
    for name in os.listdir(directory):
        p = os.path.join(directory, name)
        if p not in keep and name.endswith((".code", ".tmp")):
            try:
                entries.append((os.stat(p).st_mtime, p))
            except OSError:
                pass
    for _, p in sorted(entries, reverse=True)[KEEP_ENTRIES - 1:]:
        try:
            os.unlink(p)
        except OSError:
            pass


def load(module, source, path, keep, key):
    """(code, how): the module's code object, from the cache entry `path` when it is this source's."""
    source_sha = hashlib.sha256(source).hexdigest()
    if source_sha != module["sha256"]:
        sys.stderr.write("fleetpatch agent: %s arrived damaged (sha256 differs from the laptop's); rerun\n"
                         % module["filename"])
        os._exit(3)
    code = load_cached(path, source_sha, key) if path else None
    if code is not None:
        return code, "cached"
    code = compile(source, module["filename"], "exec")
    if path:
        store(path, source_sha, code, keep, key)
    return code, "compiled"


def new_module(name):
    """An empty module `name` registered in sys.modules, in its package (made empty
    when it is not there yet): what `import` would make of a file, without a file."""
    from importlib.machinery import ModuleSpec

    parent, _, leaf = name.rpartition(".")
    if parent and parent not in sys.modules:
        package = types.ModuleType(parent)
        package.__spec__ = ModuleSpec(parent, None, is_package=True)
        package.__path__ = []   # nothing of it is ever looked for on disk
        package.__package__ = parent
        sys.modules[parent] = package
    module = types.ModuleType(name)
    module.__spec__ = ModuleSpec(name, None)
    module.__package__ = parent
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], leaf, module)
    return module


def finish():
    """The request loop has ended (bye, or the channel closed): every reply was flushed,
    the session's lock released or left with its note, its threads joined or done. What
    is left is the interpreter's finalization, which tears down every module and object
    one by one to free memory the exit frees anyway: run the exit handlers (a journal
    reader's; atexit's own runner, the one private name here), flush, and leave with
    status 0. Measured: boot + bye 46-48 -> 42 ms of CPU (bench hosts, Python 3.11)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (IOError, OSError, ValueError):
            pass
    os._exit(0)


def boot():
    # The modules' objects live as long as the process: collecting while they are built
    # (thousands of new containers) finds nothing to free; freezing them after keeps
    # the requests' collections from walking them again (boot + bye: 46-48 -> 41 ms of CPU).
    gc.disable()
    header = json.loads(zlib.decompress(read_block()).decode("utf-8"))
    cache_dir, key = header.get("cache_dir"), header.get("cache_key")
    key = bytes.fromhex(key) if key else None
    if cache_dir and key:
        cache_dir = os.path.expanduser(cache_dir)
        if os.path.islink(os.path.dirname(cache_dir)):
            # a state dir that is a symlink is refused by the agent; nothing may be written through it first
            cache_dir = None
        else:
            cache_dir = trusted_dir(cache_dir)
    else:
        cache_dir = None
    modules = header["modules"]
    sources = zlib.decompress(read_exact(header["compressed"]))
    loaded, at = [], 0
    for module in modules:
        loaded.append((module, sources[at:at + module["size"]]))
        at += module["size"]
    paths = [entry_path(cache_dir, m["sha256"], m["filename"], key) if cache_dir else None for m in modules]
    keep = set(p for p in paths if p)
    info = {}
    for (module, source), path in zip(loaded, paths):
        code, how = load(module, source, path, keep, key)
        info[module["name"]] = how
        exec(code, new_module(module["name"]).__dict__)
    gc.freeze()
    gc.enable()
    sys.modules[header["run"]].serve(0, info)
    finish()


if __name__ == "__fleetpatch_boot__":
    boot()
