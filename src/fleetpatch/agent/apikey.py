"""The API key of the server the agent talks to, read on the host from the server's own process.

A server started with an API key answers 401 to a request without `Authorization: Bearer <key>`:
SGLang's `--api-key` (every path but /health*, /metrics* and, 0.5.20+, /ready*), vLLM's `--api-key`,
else `VLLM_API_KEY` in its environment (the paths under /v1; 0.22+ /v2 and /inference too, 0.27+
/cohere). The agent reads the key where the server got it, /proc/PID/cmdline (and /proc/PID/environ
for the engine's variable), and sends it on its own requests to that server: the health checks,
/server_info, the loads of a drain, the smoke requests. The key never leaves the host: the launch
the agent reports has it masked (the laptop's `redact`, sent with the agent), and the session masks any key it read
in every line it writes to the laptop (`scrub`), the server's log lines included.

Pure functions over bytes and words, and one reader of /proc (`read_server_key`). Stdlib, 3.8+.
"""
from .base import read_bytes, redact

KEY_FLAGS = ("--api-key", "--api_key")   # vLLM's parser takes either spelling; SGLang's the first
MASK = redact.MASK
# A key shorter than this is masked by name only (`api_key='...'`, `--api-key X`), not wherever its
# characters appear: a two-letter key replaced in every log line would break the ready line.
MIN_SCRUB_LEN = 6


class ServerKey(object):
    """What the agent found: `key` (None: none found), the `pid` it read, `source` (the flag or the
    variable that gave it) and `unreadable` (why /proc/PID could not be read; None when it could)."""

    def __init__(self, key=None, pid=None, source=None, unreadable=None):
        self.key, self.pid, self.source, self.unreadable = key, pid, source, unreadable

    def headers(self):
        """The request headers that carry the key (none without one, or for one no header can hold)."""
        if not self.key or any(c in self.key for c in "\r\n\0"):
            return {}
        return {"Authorization": "Bearer " + self.key}


def key_from_argv(words, environ=None):
    """The value of the last `--api-key X` / `--api-key=X` in a command line (a list of str), as
    argparse keeps the last; vLLM's `--api-key K1 K2` gives K1, one it accepts. A command run by a
    shell (`sh -c "... --api-key $KEY"`) is split and read too, a `$VAR` value taken from `environ`
    (a callable: name -> value or None). None when there is none, or it is empty (neither engine
    checks an empty key)."""
    key = None
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if name in KEY_FLAGS:
            if eq:
                key = value
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                key = words[i + 1]
                i += 1
        i += 1
    if key is None:
        key = _key_in_shell_words(words, environ)
    return key or None


def _key_in_shell_words(words, environ):
    import shlex   # only a shell's command line needs it: most never get here
    for word in words:
        if not any(f in word for f in KEY_FLAGS) or not any(c.isspace() for c in word):
            continue
        try:
            inner = shlex.split(word)
        except ValueError:
            continue
        key = key_from_argv(inner)
        if key and key.startswith("$"):
            name = key[1:].strip("{}")
            key = environ(name) if environ is not None and name.replace("_", "a").isalnum() else None
        if key:
            return key
    return None


def env_value(raw, name):
    """The value of `name` in the bytes of a /proc/PID/environ (NUL-separated), as getenv finds it
    (the first); None when absent or empty (vLLM checks `if key`)."""
    prefix = name.encode("utf-8") + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "surrogateescape") or None
    return None


def server_key(cmdline, read_environ, env_name=None):
    """(key, source) from a server's /proc/PID/cmdline bytes; the environment (`read_environ()`,
    its bytes: it may raise OSError) only where the command line names none, as vLLM lets
    `--api-key` take precedence over VLLM_API_KEY. Pure but for `read_environ`."""
    words = [w.decode("utf-8", "surrogateescape") for w in cmdline.split(b"\0") if w]
    cache = {}

    def environ(name):
        if "raw" not in cache:
            cache["raw"] = read_environ()
        return env_value(cache["raw"], name)

    key = key_from_argv(words, environ)
    if key:
        return key, "--api-key"
    if env_name:
        key = environ(env_name)
        if key:
            return key, env_name
    return None, None


def read_server_key(pid, env_name=None, read=read_bytes):
    """The ServerKey of the server process `pid`: what /proc says, or why it cannot be read
    (not root, the process gone). Never raises."""
    if not pid:
        return ServerKey(unreadable="no server process is known")
    base = "/proc/%d/" % pid
    try:
        cmdline = read(base + "cmdline")
        if not cmdline:
            # a process just exec'd (its new memory not yet there) or exiting: read again later
            return ServerKey(pid=pid, unreadable="cmdline: empty, the process is starting or exiting")
        key, source = server_key(cmdline, lambda: read(base + "environ"), env_name)
    except (IOError, OSError) as e:
        what = (getattr(e, "filename", None) or "").rsplit("/", 1)[-1] or "cmdline"
        return ServerKey(pid=pid, unreadable="%s: %s" % (what, getattr(e, "strerror", None) or e))
    return ServerKey(key, pid, source)


def refused_text(status, found, env_name=None):
    """What an HTTP 401 from the server means, as the host's failure says it; None for any other
    status (or no ServerKey). The text names no key, and no flag is followed by a word that the
    laptop's masking would take for its value."""
    if status != 401 or found is None:
        return None
    if found.key is not None:
        return ("the server answered 401 to the key that the agent read (the server's %s, pid %s): it accepts "
                "another one; check how the server gets its key (a --config file, a second --api-key), then rerun"
                % (found.source, found.pid))
    if found.unreadable:
        return ("the server answered 401: it was started with an API key that the agent could not read from "
                "/proc/%s (%s); run fleetpatch as root on the host (the inventory's `user`) or as the user the "
                "server runs as, so that the agent can read the server's command line%s, then rerun"
                % (found.pid if found.pid else "PID", found.unreadable, " and environment" if env_name else ""))
    return ("the server answered 401: it wants an API key, but its command line (/proc/%s/cmdline) names no "
            "--api-key%s; give the server its key on its command line (--api-key)%s, then rerun"
            % (found.pid, ", and its environment no %s" % env_name if env_name else "",
               " or in %s" % env_name if env_name else ""))


# ------------------------------------------------------------------ what leaves the host

# the protocol's own words: never a secret, and replaced they would break the line for the laptop
_PROTOCOL_FIELDS = ("t", "op", "code", "ended", "status", "mode")


def scrub(obj, keys):
    """A reply (JSON-like) for the laptop with every key of `keys` in its text values replaced by
    MASK; names and the protocol's own words (`_PROTOCOL_FIELDS`) are left as they are, so that a
    key that happens to be one of them cannot break the line."""
    keys = [k for k in keys if len(k) >= MIN_SCRUB_LEN]
    return _scrubbed(obj, keys) if keys else obj


def _scrubbed(obj, keys):
    if isinstance(obj, str):
        for key in keys:
            if key in obj:
                obj = obj.replace(key, MASK)
        return obj
    if isinstance(obj, dict):
        return dict((k, v if k in _PROTOCOL_FIELDS else _scrubbed(v, keys)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return [_scrubbed(v, keys) for v in obj]
    return obj


def scrub_bytes(data, keys):
    """Bytes (an answer's body, before it is packed for the laptop) with every key replaced by MASK."""
    for key in keys:
        if len(key) >= MIN_SCRUB_LEN:
            data = data.replace(key.encode("utf-8", "surrogateescape"), MASK.encode())
    return data


def start_keys(restart, env_name=None):
    """The keys the restart settings start the server with (`argv`, `env`): a server that dies
    before its /proc is read has still logged its key (SGLang's ServerArgs dump)."""
    restart = restart or {}
    keys = [key_from_argv([str(w) for w in restart.get("argv") or []])]
    if env_name:
        keys.append((restart.get("env") or {}).get(env_name))
    return [k for k in keys if k]


def known_key(state, pid, env_name=None):
    """read_server_key, its key noted in the session's `secrets` (state: an AgentState, or None) so
    that no line the session writes carries it."""
    found = read_server_key(pid, env_name)
    if found.key and state is not None:
        state.secrets.add(found.key)
    return found
