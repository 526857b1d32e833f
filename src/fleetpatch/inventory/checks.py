"""The checks behind hosts.yaml: strict YAML (no duplicate keys), each key's type and
unknown keys against the schema, and the words of every message (`InventoryError`)."""
from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable, Dict, Optional

import yaml

from ..errors import UsageError
from ..router import check_router_section, check_smoke_section


ENV_VAR = "FLEETPATCH_INVENTORY"
DEFAULT_STATE_DIR_ROOT = "/var/lib/fleetpatch"
DEFAULT_STATE_DIR_USER = "~/.local/state/fleetpatch"
RESTART_KINDS = ("command", "systemd", "supervisor", "container")
RUNTIMES = ("docker", "podman")   # engine.runtime: the CLI run on a container host (the same commands)
CONTAINER_LOG = "container"        # server.log on a container host: the container's output
HOST_AGENT_PYTHON = "python3"      # runs the agent on a container host (engine.python is inside the container)

class InventoryError(UsageError):
    """The inventory cannot be used (exit 2). str() names the file, the key and the reason."""

    def __init__(self, file: str, key: Optional[str], reason: str):
        self.file = file
        self.key = key
        self.reason = reason
        super().__init__(f"{file}: {key}: {reason}" if key else f"{file}: {reason}")


def listed_names(names) -> str:
    names = list(names)
    shown = ", ".join(names[:20])
    return shown + (f", … ({len(names)} in all)" if len(names) > 20 else "")


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --------------------------------------------------------------------------- YAML


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (safe_load silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        except TypeError:
            pass  # unhashable key: the base constructor reports it
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _construct_object(loader: _StrictLoader, node: yaml.Node, deep: bool = False):
    # PyYAML's scalar constructors raise bare ValueError, IndexError, ... for values
    # the resolver let through ("2001-02-30", "!!float abc", "!!int x", an empty
    # "!!int"): whatever they raise is about the input, so report it as a YAML
    # error at the node's line.
    try:
        return yaml.SafeLoader.construct_object(loader, node, deep=deep)
    except (yaml.YAMLError, RecursionError):
        raise
    except Exception as exc:  # noqa: BLE001 - see above
        tag = node.tag.rsplit(":", 1)[-1]
        value = node.value if isinstance(node, yaml.ScalarNode) else f"a {node.id}"
        raise yaml.constructor.ConstructorError(
            None, None, f"{value!r} is not a valid {tag} ({exc}); quote it to make it a string",
            node.start_mark) from None


_StrictLoader.construct_object = _construct_object  # type: ignore[assignment]


# The same loader on libyaml's parser (PyYAML built with it: yaml.CSafeLoader): the same
# constructors, resolver and marks, a tenth of the CPU (a 32-host hosts.yaml: 20 ms -> 2.5 ms,
# on the path to the first connect; issue 34). Only for a document it surely reads as the
# pure-Python loader does: every error is re-read by _StrictLoader for its exact message, and
# libyaml's composer recurses in C without Python's limit (a few 100k levels end the process),
# so a document nested deeper than this, or with characters the pure reader refuses, goes there.
_C_LOADER = getattr(yaml, "CSafeLoader", None)
_C_MAX_DEPTH = 64
_C_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_C_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)

if _C_LOADER is not None:
    class _CStrictLoader(_C_LOADER):  # type: ignore[misc,valid-type]
        """_StrictLoader's constructors on libyaml's scanner and parser."""

    _CStrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    _CStrictLoader.construct_object = _construct_object  # type: ignore[assignment]


def _c_loadable(text: str) -> bool:
    """Printable as the pure reader wants, and nested at most _C_MAX_DEPTH deep (libyaml's
    event parser keeps its own stack: reading the events recurses nowhere)."""
    if _C_LOADER is None or yaml.reader.Reader.NON_PRINTABLE.search(text):
        return False
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_C_LOADER):
            if isinstance(event, _C_OPEN):
                depth += 1
                if depth > _C_MAX_DEPTH:
                    return False
            elif isinstance(event, _C_CLOSE):
                depth -= 1
    except yaml.YAMLError:
        return False
    return True


def _strict_load(text: str):
    if _c_loadable(text):
        try:
            return yaml.load(text, Loader=_CStrictLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError:
            pass   # the pure loader says it in its own words
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(text: str, origin: str, error: Callable[[str, Optional[str], str], Exception]):
    """yaml safe-load `text` (duplicate keys refused); a YAML error becomes error(origin, None, reason)."""
    try:
        return _strict_load(text)
    except RecursionError:
        raise error(origin, None, "not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        ctx = getattr(exc, "context", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = f"not valid YAML{where}: {problem}"
        if ctx and ctx not in problem:
            reason += f" ({ctx})"
        raise error(origin, None, reason) from None


# --------------------------------------------------------------------------- validation


def value_shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return repr(value)


_ODD_KEY = re.compile(r"[\x00-\x1f\x7f]")


def key_shown(key: Any) -> str:
    """A key as messages show it: as written, quoted when empty, padded or holding control characters."""
    if isinstance(key, str):
        return key if key and key == key.strip() and not _ODD_KEY.search(key) else repr(key)
    return value_shown(key)


class Checker:
    """Validation context: the file name for messages."""

    def __init__(self, file: str):
        self.file = file

    def fail(self, key: Optional[str], reason: str) -> InventoryError:
        return InventoryError(self.file, key, reason)

    # scalar checks; each returns the normalized value
    def string(self, key: str, v: Any, *, empty_ok: bool = False) -> str:
        if not isinstance(v, str):
            hint = " (quote it)" if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
            raise self.fail(key, f"expected a string, got {value_shown(v)}{hint}")
        if not empty_ok and not v.strip():
            raise self.fail(key, "must not be empty")
        return v

    def integer(self, key: str, v: Any, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(key, f"expected an integer, got {value_shown(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self.fail(key, f"expected an integer from {lo} to {hi}, got {v}")
        return v

    def number(self, key: str, v: Any, *, positive: bool = True) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(key, f"expected a number of seconds, got {value_shown(v)}")
        if v != v or v in (float("inf"), float("-inf")):
            raise self.fail(key, f"expected a finite number of seconds, got {v}")
        if positive and v <= 0:
            raise self.fail(key, f"must be more than 0 seconds, got {v}")
        if not positive and v < 0:
            raise self.fail(key, f"must not be negative, got {v}")
        return v

    def mapping(self, key: str, v: Any) -> dict:
        if not isinstance(v, dict):
            raise self.fail(key, f"expected a mapping, got {value_shown(v)}")
        for k in v:
            if not isinstance(k, str):
                hint = (" (YAML reads yes/no/on/off/true/false as booleans: quote the key)"
                        if isinstance(k, bool) else " (quote the key)")
                raise self.fail(f"{key}.{value_shown(k)}" if key else value_shown(k), f"keys must be strings, got {value_shown(k)}{hint}")
        return v


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTAINER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
GATEWAY_RE = re.compile(r"^(?:(?P<user>[^@\s:/\[\]]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(?::(?P<port>\d+))?$")


def _env(v: Checker, key: str, value: Any) -> Dict[str, str]:
    value = v.mapping(key, value)
    out = {}
    for name, val in value.items():
        k = f"{key}.{key_shown(name)}"
        if not _ENV_NAME.match(name):
            raise v.fail(k, "not a valid environment variable name (letters, digits and _, not starting with a digit)")
        if isinstance(val, bool):
            out[name] = "True" if val else "False"
        elif isinstance(val, (int, float, str)):
            out[name] = str(val)
        else:
            raise v.fail(k, f"expected a string, got {value_shown(val)}")
    return out


# The schema: key -> ("str" | "int" | "port" | "num" | "num0" | "env" | dict (nested)), used for the
# structural pass over defaults and every host section (types and unknown keys; nothing is required).
_RESTART_SCHEMA = {
    "kind": "restart_kind", "start": "str", "env": "env", "workdir": "str", "pidfile": "str",
    "stop_grace": "num0", "unit": "str", "program": "str", "config": "str",
}
_SERVER_SCHEMA = {"log": "str", "health_url": "url", "ready_timeout": "num", "restart": _RESTART_SCHEMA,
                  "url": "url", "smoke": "smoke"}
_ENGINE_SCHEMA = {"kind": "engine_kind", "python": "str", "state_dir": "str", "probe": "bool",
                  "container": "container", "runtime": "runtime"}
HOST_SCHEMA = {
    "address": "str", "user": "str", "port": "port", "identity_file": "str", "known_hosts": "str",
    "connect_timeout": "num", "gateway": "gateway", "engine": _ENGINE_SCHEMA, "server": _SERVER_SCHEMA,
    "servers": "servers", "router": "router",
}


def _check_engine_kind(v: Checker, key: str, value: Any) -> str:
    value = v.string(key, value)
    try:
        from ..engines import KINDS as kinds  # the registry's names; importing no profile
    except ImportError:  # pragma: no cover - no registry to ask
        return value
    if value not in kinds:
        raise v.fail(key, f"unknown engine kind {value!r}; fleetpatch has profiles for {', '.join(kinds)}")
    return value


def _check_scalar(v: Checker, key: str, kind: str, value: Any) -> Any:
    if kind == "str":
        return v.string(key, value)
    if kind == "port":
        return v.integer(key, value, 1, 65535)
    if kind == "num":
        return v.number(key, value)
    if kind == "num0":
        return v.number(key, value, positive=False)
    if kind == "env":
        return _env(v, key, value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise v.fail(key, f"expected true or false, got {value_shown(value)}")
        return value
    if kind == "restart_kind":
        value = v.string(key, value)
        if value not in RESTART_KINDS:
            raise v.fail(key, f"expected one of {', '.join(RESTART_KINDS)}{did_you_mean(value, RESTART_KINDS)}, "
                              f"got {value!r}")
        return value
    if kind == "engine_kind":
        return _check_engine_kind(v, key, value)
    if kind == "runtime":
        value = v.string(key, value)
        if value not in RUNTIMES:
            raise v.fail(key, f"expected one of {', '.join(RUNTIMES)}{did_you_mean(value, RUNTIMES)}, got {value!r}")
        return value
    if kind == "container":
        value = v.string(key, value)
        if not _CONTAINER_NAME.match(value):
            raise v.fail(key, f"not a container name or id: {value!r} (letters, digits, '_', '.', '-')")
        return value
    if kind == "url":
        value = v.string(key, value)
        if not re.match(r"^https?://[^/\s]+", value):
            raise v.fail(key, f"expected an http:// or https:// URL, got {value!r}")
        return value
    if kind == "gateway":
        return v.string(key, value)
    if kind == "router":
        return check_router_section(v.fail, key, v.mapping(key, value))
    if kind == "smoke":
        return check_smoke_section(v.fail, key, v.mapping(key, value))
    if kind == "servers":
        return _check_servers(v, key, value)
    raise AssertionError(kind)  # pragma: no cover


def _check_servers(v: Checker, key: str, value: Any) -> dict:
    """`servers:`: server name -> the keys of `server`, in file order."""
    node = v.mapping(key, value)
    if not node:
        raise v.fail(key, "no servers listed; give each server by name (s0: {url: ..., log: ..., restart: ...}), "
                          "or use `server:` for a host with one server")
    out = {}
    for name, section in node.items():
        if not isinstance(name, str) or not HOST_NAME_RE.match(name):
            raise v.fail(f"{key}.{key_shown(name)}", "not a usable server name (letters, digits, '.', '-', '_')")
        out[name] = check_section(v, f"{key}.{name}", section if section is not None else {}, _SERVER_SCHEMA)
    return out


def check_section(v: Checker, prefix: str, node: Any, schema: dict) -> dict:
    """Types and unknown keys of one section as written; None for a key means "not set" (dropped)."""
    node = v.mapping(prefix, node)
    out = {}
    for k, value in node.items():
        key = f"{prefix}.{key_shown(k)}" if prefix else key_shown(k)
        if k not in schema:
            hint = did_you_mean(k, schema)
            raise v.fail(key, f"unknown key{hint}; known keys here: {', '.join(schema)}")
        kind = schema[k]
        if value is None:
            if not isinstance(kind, dict):
                out[k] = None  # "not set": overrides a default
            continue
        if isinstance(kind, dict):
            out[k] = check_section(v, key, value, kind)
        else:
            out[k] = _check_scalar(v, key, kind, value)
    return out


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], value)
        else:
            out[k] = value
    return out


def or_default(value: Any, default: Any) -> Any:
    return default if value is None else value


def expand_user(path: Optional[str]) -> Optional[str]:
    return os.path.expanduser(path) if path else path
