"""Host data made safe to show: secrets masked, control bytes escaped, never rich markup.

Anything that came from a host (a log line quoted in a failure, a package's
`Version:`, a ledger value) can carry terminal escapes: OSC 0 retitles the
window, OSC 52 writes the clipboard, OSC 8 makes links, CSI 2J clears the
screen. Printed raw they act on the operator's terminal, piped or not. Here
every such byte becomes a visible escape (`\\x1b`), and `cell` wraps text in a
`rich.text.Text` so `[/]` or `[link=...]` is shown as written, not parsed.
Every value named like a secret (`--api-key X`, `HF_TOKEN=X`) is shown as
`***` (`redact.text`): whatever reaches the terminal passes through here.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import redact

if TYPE_CHECKING:
    from rich.text import Text

# C0 controls except newline and tab, DEL, the C1 controls (0x80-0x9f: a lone
# CSI 0x9b is an escape on many terminals), and the Unicode bidi overrides
# that reorder what the operator reads.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = ord(m.group(0))
    if c == 0x0A:
        return "\\n"
    if c == 0x09:
        return "\\t"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: object) -> str:
    """`text` with every control byte shown as an escape; newlines and tabs kept
    (a message is several lines on purpose)."""
    return _UNSAFE.sub(_escape, redact.text("" if text is None else str(text)))


def safe_line(text: object) -> str:
    """Like `safe`, and newlines and tabs escaped too: for one table cell or one line."""
    return _UNSAFE_LINE.sub(_escape, redact.text("" if text is None else str(text)))


def cell(text: object, style: str = "") -> Text:
    """A table cell that shows host data as written: escaped, never markup."""
    from rich.text import Text

    return Text(safe_line(text), style=style)
