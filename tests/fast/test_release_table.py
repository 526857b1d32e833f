"""docs/engine-versions.md's table of supported SGLang releases is the one the facts
generate (`invoke supported-releases`): adding a release's facts without regenerating
the table fails here."""
from __future__ import annotations

from support.paths import REPO

from fleetpatch.engines import sglang_wheel


def test_the_table_of_supported_releases_is_generated_from_the_facts():
    text = (REPO / "docs" / "engine-versions.md").read_text()
    begin, end = "<!-- generated: invoke supported-releases -->\n", "<!-- end generated -->"
    assert begin in text and end in text
    shown = text.split(begin, 1)[1].split(end, 1)[0]
    assert shown == sglang_wheel.supported_table(), (
        "docs/engine-versions.md is stale: replace its table with the output of `invoke supported-releases`")
    assert "| 0.5.7 |" in shown and "| 0.5.23 |" in shown
