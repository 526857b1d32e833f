"""Host data is shown, never obeyed, by `status` over real sshd: a hostile engine
version and ledger (terminal escapes, rich markup) are printed escaped and as written
(issue 8, defects 1 and 2); the pure rendering is in tests/fast/test_cli_hostile.py."""
from __future__ import annotations

import json

from support.marks import needs_fleet
from support.hostile import HOSTILE


@needs_fleet
def test_status_on_a_host_with_hostile_version_and_ledger_shows_it_escaped(operator, fleet):
    h = fleet.hosts["v1a"]
    meta = next(h.site_packages.glob("sglang-*.dist-info/METADATA"))
    original = meta.read_bytes()
    try:
        meta.write_bytes(original.replace(b"\nVersion: 0.5.9\n", ("\nVersion: 0.5.9" + HOSTILE[0] + "\n").encode(), 1))
        h.state_dir.mkdir(parents=True, exist_ok=True)
        ledger = {"version": 1, "restart_pending": False, "last_restart": None,
                  "patches": {"[/]": {"label": "[/]" + HOSTILE[1], "files": {}, "seq": 1},
                              "x": {"label": "[link=http://evil.invalid]x[/link]" + HOSTILE[3], "files": {}, "seq": 2}},
                  "last_verification": {"status": "[/]", "at": HOSTILE[2]}}
        (h.state_dir / "ledger.json").write_text(json.dumps(ledger))
        run = operator.run("status", "--hosts", "v1a")
    finally:
        meta.write_bytes(original)
    assert "Traceback" not in run.output and "MarkupError" not in run.output
    assert run.code in (0, 1), run
    assert "\x1b]" not in run.output and "\x07" not in run.output
    assert "[/]" in run.output and "[link=http://evil.invalid]x[/link]" in run.output
    assert "\\x1b]0;owned\\x07" in run.output and "\\x1b[2J" in run.output
    assert run.report["hosts"]["v1a"]["engine_version"] == "0.5.9" + HOSTILE[0], "the report keeps the raw value"
