"""Host data is shown, never obeyed: terminal escapes from a host are escaped
and rich markup in host data is printed as written (issue 8, defects 1 and 2)."""
from __future__ import annotations

import io

from rich.console import Console

from fleetpatch import report as rep
from fleetpatch import textsafe
from fleetpatch.steps import HostResult
from support.hostile import HOSTILE, MARKUP


def test_every_control_byte_is_escaped_and_newlines_kept_in_messages():
    text = "line 1 " + "".join(HOSTILE) + "\nline 2\t" + "\x00\x7f\u202e"
    out = textsafe.safe(text)
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\u202e" not in out
    assert "\\x1b]0;owned\\x07" in out and "\\x1b[2J" in out and "\\x9b31m" in out and "\\u202e" in out
    assert out.count("\n") == 1 and "\t" in out
    assert textsafe.safe_line("a\nb\tc") == "a\\nb\\tc"
    assert textsafe.safe("plain, ünïcode ✓") == "plain, ünïcode ✓"


def render(*renderables) -> str:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=400, color_system="truecolor")
    for r in renderables:
        console.print(r)
    return buf.getvalue()


def test_the_summary_table_and_messages_show_host_data_as_written():
    results = {"h[/]": HostResult("h[/]", False, "not-executed", "FAIL h: log line " + "".join(HOSTILE) + " [/]",
                                  engine_version="0.5.9" + HOSTILE[0], patch="[link=http://evil.invalid]p[/link]")}
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=400)
    rep.print_outcome(console, "deploy-patch", results)
    out = buf.getvalue()
    visible = out.replace("\x1b[", "CSI[")  # rich's own colour codes are CSI ... m; no OSC, no 2J may remain
    assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out
    assert "CSI[2J" not in visible
    assert "\\x1b]0;owned\\x07" in out and "\\x1b[2J" in out
    assert "[link=http://evil.invalid]p[/link]" in out and "h[/]" in out
    assert "\x1b]8;" not in out, "no hyperlink is rendered"


def test_the_status_table_is_never_markup():
    d = {"reachable": True, "applied": list(MARKUP), "drift": ["a/[/]"], "server_up": True,
         "last_verification": {"status": "[link=http://evil.invalid]verified[/link]", "at": HOSTILE[3]}}
    out = render(rep.status_table({"h1": HostResult("h1", True, "ok", engine_version=HOSTILE[1], details=d)}))
    for m in MARKUP:
        assert m in out
    assert "\x1b]" not in out and "\\x1b]52;c;cm0gLXJmIH4=\\x07" in out and "\\x1b[2J" in out
