"""The load generator against stand-in servers (no router): counts, cuts, failures, bounds."""
from __future__ import annotations

import signal
import time

import pytest

from fleetpatch_demo.loadgen import CUT, FAILED, OK, LoadGen, main, send_one
from fleetpatch_demo.routerproc import LocalWorker, free_port, standin_site


@pytest.fixture
def worker(tmp_path):
    w = LocalWorker(standin_site(tmp_path / "site"), tmp_path / "w.log",
                    env={"FLEETPATCH_STANDIN_TOKEN_SECONDS": "0.01"}).start()
    yield w
    w.stop()


def test_a_steady_mix_is_counted_ok(worker):
    lg = LoadGen(worker.url, concurrency=3, stream_share=0.5, tokens=(2, 5), max_requests=12)
    counts = lg.run()
    assert counts == {"sent": 12, OK: 12, FAILED: 0, CUT: 0, "streams": 6, "in_flight": 0}
    assert sorted(o.index for o in lg.outcomes) == list(range(12))
    assert {o.tokens for o in lg.outcomes} == {2, 5}
    assert worker.text_since_start().count('"POST /generate HTTP/1.1" 200') == 1 + 12  # warm-up + ours


def test_a_stream_whose_server_dies_is_cut_and_later_requests_fail(tmp_path):
    w = LocalWorker(standin_site(tmp_path / "site"), tmp_path / "w.log",
                    env={"FLEETPATCH_STANDIN_TOKEN_SECONDS": "0.02"}).start()
    try:
        lg = LoadGen(w.url, concurrency=2, stream_share=1.0, tokens=(200,), max_requests=4, timeout=10).start()
        time.sleep(0.8)
        w.signal(signal.SIGKILL)
        counts = lg.wait()
    finally:
        w.stop()
    assert counts["sent"] == 4 and counts[OK] == 0
    assert counts[CUT] == 2 and counts[FAILED] == 2, lg.outcomes
    cut = [o for o in lg.outcomes if o.result == CUT]
    assert all("without [DONE]" in o.detail or "after" in o.detail for o in cut)
    assert all(o.detail.startswith(("no answer: ConnectionRefusedError", "no answer: ConnectionResetError")) for o in lg.outcomes
               if o.result == FAILED), [o.detail for o in lg.outcomes]


def test_single_requests_and_http_errors(worker):
    assert send_one(worker.url, True, 3) == (OK, "3 events")
    assert send_one(worker.url, False, 3) == (OK, "")
    assert send_one(worker.url, False, 0)[0] == OK
    result, detail = send_one(worker.url + "/nope", False, 1)
    assert result == FAILED and detail.startswith("HTTP 404")


def test_bounded_in_time_and_loopback_only(worker):
    t0 = time.monotonic()
    counts = LoadGen(worker.url, concurrency=2, tokens=(30,), max_seconds=0.5).run()
    assert time.monotonic() - t0 < 0.5 + 0.3 * 2 + 1.0  # the last requests finish, none start late
    assert counts["sent"] >= 2 and counts[OK] == counts["sent"]
    for url in ("http://10.0.0.1:30000", "https://127.0.0.1:1", "http://example.com"):
        with pytest.raises(ValueError, match="only sends to http://127.0.0.1"):
            LoadGen(url)
    with pytest.raises(ValueError):
        LoadGen(worker.url, concurrency=0)


def test_cli_prints_counts_and_fails_on_refused(capsys):
    rc = main(["http://127.0.0.1:%d" % free_port(), "--requests", "3", "--concurrency", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and '"sent": 3' in out and '"failed": 3' in out
    assert main(["http://10.1.1.1:1", "--requests", "1"]) == 2
