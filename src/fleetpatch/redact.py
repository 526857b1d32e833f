"""Secrets hidden from what fleetpatch shows and writes on the laptop.

A server's launch carries secrets: `--api-key sk-...`, `HF_TOKEN=...` in its
environment, and the same values again in `/server_info` and in the
`ServerArgs(...)` dump of its log. fleetpatch judges with the real values on
the host; everything it prints or writes here passes through these functions,
which show the value of anything named like a secret as `***`.

A name is a secret's when one of its words (split at `-`, `_`, `.` and
camelCase) is token, secret, password, passwd, credential(s),
authorization or apikey, or two of them in a row are api and key:
`--admin-api-key`, `HF_TOKEN`, `ssl_keyfile_password`; never
`max_total_tokens` or `tokenizer_path`.
"""
from __future__ import annotations

import collections
import functools
import re

MASK = "***"
_SECRET_WORDS = frozenset({"token", "secret", "secrets", "password", "passwd", "credential", "credentials",
                           "authorization", "apikey"})
_WORD = r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+"
# Values that hide nothing: shown as they are, so "no key was set" stays readable.
_EMPTY = frozenset({"", "None", "null", "''", '""', "false", "False"})


# A report walks every key of every host's result (thousands of the same few hundred names).
@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    if "/" in name or name.endswith(".py"):   # a file (sglang/srt/token_utils.py) is no setting
        return False
    if not _may_name_a_secret(name):   # each secret word holds one of these: most names are done here
        return False
    words = [w.lower() for w in _word_pattern().findall(name)]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(a == "api" and b == "key" for a, b in zip(words, words[1:]))


def argv(args) -> list:
    """A command line with the value of every secret flag masked: `--api-key X`
    (the next word) and `--api-key=X`."""
    out = []
    hide_next = False
    for arg in args:
        if not isinstance(arg, str):
            out.append(data(arg))
            hide_next = False
            continue
        if hide_next and not arg.startswith("--"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if arg.startswith("-") and is_secret_name(arg.split("=", 1)[0]):
            if "=" in arg:
                name, value = arg.split("=", 1)
                out.append(arg if value in _EMPTY else f"{name}={MASK}")
                continue
            hide_next = True
        out.append(text(arg))
    return out


_PLAIN = frozenset({bool, int, float})   # values data() returns as they are: not walked through a call


def data(value):
    """Any JSON-like value with secrets masked: a secret key's value in a dict,
    a secret flag's value in a list of words, and whatever `text` finds in a string."""
    if isinstance(value, dict):
        return {k: (_mask_value(v) if isinstance(k, str) and is_secret_name(k)
                    else v if v is None or v.__class__ in _PLAIN else data(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return argv(value)
    if isinstance(value, str):
        return text(value)
    return value


def _mask_value(value):
    # A dict or list under a secret-like key (a host or patch named "token-fix") is walked, not hidden:
    # a secret is one value.
    if isinstance(value, (dict, list, tuple)):
        return data(value)
    if value is None or isinstance(value, bool) or (isinstance(value, str) and value in _EMPTY):
        return value
    return MASK


# A name that may be a secret's (is_secret_name decides): the scan skips every other name whole,
# so `env: HF_TOKEN=x` is not read as the name env with the value HF_TOKEN=x.
_KEYWORDS = r"(?i:token|secret|passw|credential|authorization|api[\w.-]?key)"
_CANDIDATE = r"[\w.-]*" + _KEYWORDS + r"[\w.-]*"
# A flag and its value as words: `--api-key sk-1`, `--hf-token=hf_1`.
_FLAG = r"(?<![\w./-])(?P<name>--?(?=[A-Za-z])" + _CANDIDATE + r")(?P<sep>=|[ \t]+)(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\",]+)"
# A name and its value as Python, JSON, an environment or a header write it:
# `api_key='sk-1'` (the ServerArgs dump), `"api_key": "sk-1"`, `HF_TOKEN=hf_1`,
# `Authorization: Bearer sk-1`.
_PAIR = (
    r"(?<![\w./-])(?P<q>[\"']?)(?P<name>(?=[A-Za-z_])" + _CANDIDATE + r")(?P=q)(?P<sep>[ \t]*[=:][ \t]*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|(?:(?:Bearer|Basic|Token)[ \t]+)?[^\s,)'\"}\]]+)")

ValuePatterns = collections.namedtuple("ValuePatterns", "flag pair")


# Compiled at their first use, not at import: the host agent imports this module at every start
# (as fleetpatch_redact) and most of its sessions mask no value; compiling these two cost ~0.8 ms
# of each start. The word split (is_secret_name) is compiled apart: it is small, and often needed.
@functools.lru_cache(maxsize=1)
def _value_patterns() -> ValuePatterns:
    return ValuePatterns(re.compile(_FLAG), re.compile(_PAIR))


@functools.lru_cache(maxsize=1)
def _word_pattern():
    return re.compile(_WORD)


def _mask_flag(m: re.Match) -> str:
    if not is_secret_name(m.group("name")) or m.group("value").startswith("-"):
        return m.group(0)
    return m.group("name") + m.group("sep") + _masked(m.group("value"))


def _mask_pair(m: re.Match) -> str:
    if not is_secret_name(m.group("name")):
        return m.group(0)
    return m.group(0)[:m.start("value") - m.start()] + _masked(m.group("value"))


def _masked(value: str) -> str:
    if value in _EMPTY:
        return value
    if value[:1] in ("'", '"'):
        return value[0] + MASK + value[0]
    return MASK


def _may_name_a_secret(s: str) -> bool:
    """Most text names no secret: plain substring scans say so faster than the patterns can."""
    low = s.lower()
    # an `or` of `in`s, not any() over a generator: half the time, and a host's agent walks a
    # server's whole /server_info (some 330 names) through this at each deploy
    return ("key" in low or "token" in low or "secret" in low or "passw" in low or "credential" in low
            or "authorization" in low)


def _may_hold_a_value(s: str) -> bool:
    """Both patterns need a separator between a name and its value (`=`, `:`, a blank): a single
    word (`--tokenizer-path`, a path) holds none, and is left without compiling them."""
    return "=" in s or ":" in s or " " in s or "\t" in s


def text(s: str) -> str:
    """A line (a log line, a message, a command line) with every secret value it names masked."""
    if not isinstance(s, str) or not _may_name_a_secret(s) or not _may_hold_a_value(s):
        return s
    patterns = _value_patterns()
    return patterns.pair.sub(_mask_pair, patterns.flag.sub(_mask_flag, s))
