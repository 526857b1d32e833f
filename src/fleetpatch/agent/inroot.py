"""Paths inside a container's root, resolved as the container would resolve them: never out of it.

The agent reaches a container's files from the host, as root, through the container's
root as the host sees it (`/proc/<pid>/root`, or a stopped container's overlay upper
dir). The kernel resolves a path under it as the host's: an absolute symlink in the
image (`/usr/lib/python3 -> /etc`) leads back to the host's own root, and `..` can
climb out of it. So every container path is resolved here, component by component
from an fd of the root, each directory opened O_PATH|O_NOFOLLOW relative to the one
before it and each symlink read and resolved by hand: an absolute target starts again
at the container's root, `..` never climbs above it, more than MAX_LINKS links is a
loop. The result is the path the container itself would reach, as a host path under
the root, with no symlink on it (the last component's only when not followed).

A symlink in the image is thus followed where the container would follow it (a site
dir under /usr/local/lib -> /opt/...), but only inside the container. What is left: a
process in the container that swaps a directory for a symlink between this resolution
and the agent's use of the path; the writes of files.py check again for links just
before they write, and reads of the package go through `read` (an fd of the walk).

Python has no openat2 (RESOLVE_IN_ROOT); this walk is portable (Linux, 3.8+). Stdlib only.
"""
import errno
import fnmatch
import os
import stat

from .base import AgentError

MAX_LINKS = 40   # the kernel's own limit for one path walk


def parts(path):
    return [p for p in path.split("/") if p and p != "."]


def refusal(root, inside, cause):
    return AgentError("error", "container path %s (under %s): %s; nothing was read or written through it"
                      % (inside, root, cause))


class Walk(object):
    """One resolution of a container path: the canonical names so far, and an O_PATH fd of
    the root and of each directory on the way (fds[i] holds names[i]; the last name, and
    those from a missing one on, have none)."""

    def __init__(self, root, inside):
        self.root, self.inside = root, inside
        self.names = []
        self.fds = [os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
        self.links = 0
        self.missing_at = None   # the index of the first name that is not there: the rest are only names

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def up(self):
        if self.names:
            self.names.pop()
        while len(self.fds) > len(self.names) + 1:
            os.close(self.fds.pop())
        if self.missing_at is not None and len(self.names) <= self.missing_at:
            self.missing_at = None

    def count_link(self):
        self.links += 1
        if self.links > MAX_LINKS:
            raise refusal(self.root, self.inside, "more than %d symlinks on the way (a loop)" % MAX_LINKS)

    def link(self, name, refuse):
        target = os.readlink(name, dir_fd=self.fds[-1])
        if refuse:
            raise refusal(self.root, self.inside, "%s in the container is a symlink (to %s)"
                          % ("/".join([""] + self.names + [name]), target))
        self.count_link()
        if target.startswith("/"):   # the container's root, not the host's
            while len(self.fds) > 1:
                os.close(self.fds.pop())
            self.names = []
        return parts(target)

    def step(self, name, last, follow_last, refuse):
        """Resolve one component; returns the names of a link's target, to resolve before the rest."""
        if name == "..":
            self.up()
            return []
        if self.missing_at is not None:
            self.names.append(name)
            return []
        try:
            st = os.stat(name, dir_fd=self.fds[-1], follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
            self.missing_at = len(self.names)
            self.names.append(name)
            return []
        if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
            return self.link(name, refuse)
        if last:
            self.names.append(name)
            return []
        if not stat.S_ISDIR(st.st_mode):   # a file where a directory is named: nothing below it exists
            self.missing_at = len(self.names)
            self.names.append(name)
            return []
        try:
            fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fds[-1])
        except OSError as e:   # replaced by a link since the stat: looked at again
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            self.count_link()
            return [name]
        self.fds.append(fd)
        self.names.append(name)
        return []

    def run(self, follow_last, refuse):
        todo = parts(self.inside)
        while todo:
            name = todo.pop(0)
            todo = self.step(name, not todo, follow_last, refuse) + todo
        return "/" + "/".join(self.names)


def resolve(root, inside, follow_last=True, refuse_links=False):
    """The container path `inside` as the container resolves it (no symlink on it; the last
    component kept as a link when not `follow_last`). Components from the first one that does
    not exist on are kept as named. `refuse_links`: a symlink on the way is an AgentError."""
    walk = Walk(root, inside)
    try:
        return walk.run(follow_last, refuse_links)
    finally:
        walk.close()


def host_path(root, inside, follow_last=True, refuse_links=False):
    """The host path of the container path `inside`, resolved in the container's root."""
    return root.rstrip("/") + resolve(root, inside, follow_last, refuse_links)


def read(root, inside):
    """The bytes of the container file `inside` (symlinks resolved in the container)."""
    return read_stat(root, inside)[0]


def read_stat(root, inside):
    """(bytes, os.stat_result) of the container file `inside`, opened O_NOFOLLOW from an fd
    of its directory, reached by the walk: nothing outside the root is ever read."""
    walk = Walk(root, inside)
    try:
        walk.run(True, False)
        if walk.missing_at is not None:
            raise OSError(errno.ENOENT, "No such file or directory", inside)
        if len(walk.fds) != len(walk.names):   # the root itself
            raise OSError(errno.EISDIR, "Is a directory", inside)
        fd = os.open(walk.names[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=walk.fds[-1])
    finally:
        walk.close()
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", inside)
        return f.read(), st


def is_file(root, inside):
    try:
        return os.path.isfile(host_path(root, inside))
    except (AgentError, OSError):
        return False


def glob(root, pattern):
    """The container paths (canonical) that `pattern` names, a shell pattern per component
    (`/usr/local/lib/python3*/dist-packages`), each looked up in the container's root."""
    found = ["/"]
    for part in parts(pattern):
        nxt = []
        for base in found:
            if not any(c in part for c in "*?["):
                nxt.append(base.rstrip("/") + "/" + part)
                continue
            try:
                names = os.listdir(host_path(root, base))
            except (AgentError, OSError):
                continue
            nxt += [base.rstrip("/") + "/" + n for n in sorted(names) if fnmatch.fnmatchcase(n, part)]
        found = nxt
    out = []
    for inside in found:
        try:
            canonical = resolve(root, inside)
        except (AgentError, OSError):
            continue
        if canonical not in out:
            out.append(canonical)
    return out
