"""The range reader on a real wheel served by a local HTTP server that answers Range
requests as PyPI's file host does: only the central directory and the wanted members
travel, and they are the wheel's own bytes."""
from __future__ import annotations

import http.server
import re
import threading
import urllib.request
import zipfile
from pathlib import Path

import pytest

from fleetpatch.engines import sglang_wheel, vllm_members


class RangeHandler(http.server.BaseHTTPRequestHandler):
    wheel: Path = Path()
    ranges: list = []

    def do_GET(self):
        data = self.wheel.read_bytes()
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if not m:
            self.send_response(200)
            body = data
        else:
            start, end = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            self.ranges.append((start, end))
            body = data[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass   # a reader that has what it needs closes early (a whole-file GET); not this test's concern

    def log_message(self, *args):
        pass


@pytest.fixture
def served_wheel():
    found = sorted(sglang_wheel.cache_dir().glob("sglang-0.5.9-*.whl"))
    if not found:
        pytest.skip("the sglang 0.5.9 wheel is not cached: `python3 tests/support/wheelcache.py` downloads it")
    handler = type("H", (RangeHandler,), {"wheel": found[0], "ranges": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield found[0], f"http://127.0.0.1:{server.server_address[1]}/{found[0].name}", handler
    server.shutdown()
    server.server_close()


def test_only_the_directory_and_the_wanted_members_are_fetched(served_wheel, tmp_path):
    wheel, url, handler = served_wheel
    size = wheel.stat().st_size
    wanted = {"sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py"}
    got, rf = vllm_members.fetch_members(url, size, lambda n: n in wanted, tmp_path / "m", wheel.name)
    with zipfile.ZipFile(wheel) as z:
        assert got.names == set(z.namelist())
        for name in wanted:
            assert got.text(name) == z.read(name).decode()
    assert not got.has("sglang/srt/server_args.py") and "sglang/srt/server_args.py" in got.names
    assert rf.requests == len(handler.ranges) <= 3 and rf.bytes_fetched < size / 2
    assert vllm_members.Members(tmp_path / "m").wheel == wheel.name   # what the cache reads back


def test_a_server_that_ignores_range_is_refused(served_wheel, tmp_path):
    wheel, url, handler = served_wheel
    def no_range(req, timeout):   # a proxy that drops the Range header: the server answers 200, the whole file
        req.remove_header("Range")
        return urllib.request.urlopen(req, timeout=timeout)

    rf = vllm_members.RangeFile(url, wheel.stat().st_size, opener=no_range)
    with pytest.raises(RuntimeError, match="ignored the Range request"):
        rf.fetch(0, 100)
