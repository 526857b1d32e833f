"""--report and --dest are tried before any host is contacted; runs started side by
side in one folder must not fail each other's try."""
from __future__ import annotations

import threading

import pytest

from fleetpatch import report
from fleetpatch.errors import UsageError


def test_runs_started_together_in_one_folder_all_pass_the_dest_check(tmp_path):
    dest = tmp_path / ".fleetpatch" / "sources"
    errors = []

    def one():
        for _ in range(40):
            try:
                report.check_report_path(dest, "--dest", directory=True)
            except Exception as e:   # any failure here is the bug
                errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    # no write-test file is left (an empty folder two overlapping tries made may be)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("path,said", [("/proc/x.json", "No such file or directory"),
                                       ("/etc/passwd/x.json", "/etc/passwd is a file, not a directory")])
def test_a_path_that_cannot_be_written_is_still_refused_at_once(path, said):
    with pytest.raises(UsageError, match=said):
        report.check_report_path(path)
