"""The laptop side of the probe: a diff's added lines, and the execution block from records."""
import json

from fleetpatch.probe.verdict import NEVER_IMPORTED, NOT_CHANGED, added_lines, execution_block, execution_off

DIFF = """diff --git a/python/sglang/srt/a.py b/python/sglang/srt/a.py
--- a/python/sglang/srt/a.py
+++ b/python/sglang/srt/a.py
@@ -10,4 +10,5 @@ def f():
     x = 1
-    y = 2
+    y = 3
+    z = 4
     return x
 
@@ -40,2 +41,3 @@
 a
 b
+c
\\ No newline at end of file
--- /dev/null
+++ b/sglang/srt/new.py
@@ -0,0 +1,2 @@
+import os
+--- not a header
"""


def test_added_lines_are_post_image_numbers_and_follow_offsets():
    assert added_lines(DIFF) == {"sglang/srt/a.py": [11, 12, 43], "sglang/srt/new.py": [1, 2]}
    assert added_lines(DIFF, offsets={"sglang/srt/a.py": [0, 5]})["sglang/srt/a.py"] == [11, 12, 48]


def rec(d):
    return json.dumps(d).encode()


def test_the_block_names_ran_lines_files_and_reasons():
    plan = {"modules": {
        "sglang.srt.a": {"path": "sglang/srt/a.py", "expected": "/v/sglang/srt/a.py", "lines": [11, 12]},
        "sglang.srt.b": {"path": "sglang/srt/b.py", "expected": "/v/sglang/srt/b.py", "lines": [5]},
        "sglang.srt.c": {"path": "sglang/srt/c.py", "expected": "/v/sglang/srt/c.py", "lines": []},
        "sglang.srt.d": {"path": "sglang/srt/d.py", "expected": "/v/sglang/srt/d.py", "lines": [1]}}}
    added = {"sglang/srt/a.py": [11, 12], "sglang/srt/b.py": [5], "sglang/srt/d.py": [1]}
    files = {
        "41-1/process.json": rec({"pid": 41, "ppid": 1, "mode": "lines"}),
        "41-1/M-sglang.srt.a.json": rec({"module": "sglang.srt.a", "path": "sglang/srt/a.py",
                                         "file": "/v/sglang/srt/a.py", "same": True}),
        "41-1/L-sglang.srt.a-11.json": rec({"module": "sglang.srt.a", "path": "sglang/srt/a.py", "line": 11}),
        "41-1/L-sglang.srt.a-99.json": rec({"module": "sglang.srt.a", "path": "sglang/srt/a.py", "line": 99}),
        "41-1/M-sglang.srt.c.json": rec({"module": "sglang.srt.c", "path": "sglang/srt/c.py",
                                         "file": "/v/sglang/srt/c.py", "same": True}),
        "52-1/process.json": rec({"pid": 52, "ppid": 41, "mode": "lines"}),
        "52-1/M-sglang.srt.d.json": rec({"module": "sglang.srt.d", "path": "sglang/srt/d.py",
                                         "file": "/other/sglang/srt/d.py", "same": False}),
        "52-1/T-sglang.srt.a-12.json": rec({"module": "sglang.srt.a", "path": "sglang/srt/a.py", "line": 12,
                                            "traced": "CUDA graph capture"}),
    }
    block = execution_block(files, plan, added)
    assert block["mode"] == "lines" and block["pids"] == [41, 52]
    assert block["ran"] == {"sglang/srt/a.py": [11]}               # line 99 is no added line
    assert block["traced"] == {"sglang/srt/a.py": [12]}
    assert block["not_run"] == {
        "sglang/srt/b.py": NEVER_IMPORTED,
        "sglang/srt/c.py": NOT_CHANGED,
        "sglang/srt/d.py": "loaded from another file (/other/sglang/srt/d.py instead of /v/sglang/srt/d.py)"}
    assert block["imported"]["sglang.srt.d"] == "/other/sglang/srt/d.py"
    assert execution_block(files, plan, added, pids={52})["ran"] == {}


def test_no_record_at_all_says_the_probe_never_loaded():
    block = execution_block({}, {"modules": {}}, {})
    assert block["mode"] == "unavailable" and "never loaded" in block["message"]
    assert execution_off("off", "--no-probe")["mode"] == "off"
