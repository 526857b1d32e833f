"""Engine wheels come from PyPI once and are kept (engines/sglang_wheel.pip_download). Test workers
on a fresh machine want the same release at once: each must end with the whole wheel, and none may
find one that another pip is still writing in the folder they share (CI, 2026-12-06: a worker's
cache check found the other's sglang wheel half-written, and reading it failed).

No network: pip takes the wheel from a local folder (PIP_NO_INDEX, PIP_FIND_LINKS), a wheel made
here as large as sglang's (40 MB), so that its copy takes long enough to be seen half-done."""
from __future__ import annotations

import os
import threading
import time
import zipfile

import pytest

from fleetpatch.engines.sglang_wheel import pip_download

NAME, VERSION = "fpbigwheel", "1.0"


def make_wheel(folder, megabytes=40):
    """A valid pure-Python wheel holding `megabytes` of incompressible data."""
    folder.mkdir()
    path = folder / f"{NAME}-{VERSION}-py3-none-any.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        wheel.writestr(f"{NAME}/__init__.py", "")
        wheel.writestr(f"{NAME}/blob.bin", os.urandom(megabytes << 20))
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: fleetpatch-tests\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    links = tmp_path / "links"
    make_wheel(links)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def test_four_downloads_of_one_release_at_once_never_show_a_half_written_wheel(tmp_path, local_index):
    cache = tmp_path / "wheels"
    got, failed, torn = [], [], []

    def fetch():
        try:
            got.append(pip_download(f"{NAME}=={VERSION}", f"{NAME}-{VERSION}-*.whl", cache))
        except Exception as e:   # each failure is reported below, with its message
            failed.append(e)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):   # what another worker's cache check would find now
        for wheel in cache.glob(f"{NAME}-{VERSION}-*.whl"):
            try:
                with zipfile.ZipFile(wheel) as zf:
                    zf.namelist()
            except (zipfile.BadZipFile, OSError) as e:
                torn.append(f"{wheel.name}: {e}")
        time.sleep(0.001)
    for t in threads:
        t.join(120)
    assert not failed, failed
    assert not torn, torn[:3]
    assert len(got) == 4 and len(set(got)) == 1, got
    with zipfile.ZipFile(got[0]) as wheel:
        assert wheel.testzip() is None
    # each pip's own download folder is gone: only the wheel is left where the cache keeps it
    assert sorted(p.name for p in cache.iterdir()) == [got[0].name]


def test_a_release_that_is_not_there_is_named_in_the_error_and_leaves_nothing(tmp_path, local_index):
    cache = tmp_path / "wheels"
    with pytest.raises(RuntimeError) as e:
        pip_download(f"{NAME}==9.9", f"{NAME}-9.9-*.whl", cache)
    assert f"could not download {NAME}==9.9" in str(e.value)
    assert list(cache.iterdir()) == []
