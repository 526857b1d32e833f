"""The follow is woken by the probe's first record (issue 34, 2): the records dirs are watched
on the log's inotify fd, and a drain says which watch saw an event."""
from __future__ import annotations

from fleetpatch.agent.logs import LogWatch


def test_a_record_written_into_a_watched_dir_is_seen_by_the_drain(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("")
    records = tmp_path / "records"
    records.mkdir()
    watch = LogWatch(str(log))
    try:
        assert watch.fd is not None   # Linux with ctypes: inotify
        wd = watch.watch_dir(str(records))
        assert wd >= 0
        watch.drain()
        assert wd not in watch.woken
        (records / ".L-1.tmp").write_text("{}")
        (records / ".L-1.tmp").rename(records / "L-1.json")   # as the probe writes a record
        watch.drain()
        assert wd in watch.woken
        log.write_text("a line\n")   # the log's own events are told apart from the records'
        watch.woken.clear()
        watch.drain()
        assert wd not in watch.woken and watch.woken
    finally:
        watch.close()
