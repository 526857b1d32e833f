"""The few members of a vLLM wheel that its facts are read from, fetched by HTTP range.

A vLLM wheel is 240-440 MB; the Python files the facts need are a few MB of it.
PyPI's file host answers HTTP Range requests, so `fetch_members` reads the
wheel's zip central directory (the end of the file), then only the wanted
members, through `RangeFile`: a seekable, read-only file object over HTTP
ranges, given to `zipfile.ZipFile` (stdlib only).  What it fetched is kept in
the cache (`Members`: the wheel's name list and the member files), so a facts
run or its test reads each release once per machine.
"""
from __future__ import annotations

import io
import json
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Tuple

PYPI_JSON = "https://pypi.org/pypi/{project}/json"
# the x86_64 Linux wheel: the Python files are the same in every platform's wheel
WHEEL_TAGS = ("manylinux1_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux2014_x86_64",
              "manylinux_2_17_x86_64", "manylinux_2_35_x86_64", "x86_64")
_CD_TAIL = 1 << 20        # the central directory of a vLLM wheel is a few hundred KB
_GAP = 256 << 10          # wanted members closer than this are fetched in one range


class RangeFile(io.RawIOBase):
    """A read-only seekable file over HTTP ranges; spans it has fetched are kept."""

    def __init__(self, url: str, size: int, opener: Callable = urllib.request.urlopen):
        self.url, self.size, self._open = url, size, opener
        self.pos = 0
        self.spans: List[Tuple[int, bytes]] = []
        self.requests = 0
        self.bytes_fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def fetch(self, start: int, end: int) -> None:
        """Fetch bytes [start, end) in one request and keep them."""
        start, end = max(0, start), min(self.size, end)
        if start >= end or self._held(start, end) is not None:
            return
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        with self._open(req, timeout=120) as resp:
            if getattr(resp, "status", 206) != 206:
                raise RuntimeError(f"{self.url}: the server ignored the Range request (HTTP {resp.status})")
            data = resp.read()
        if len(data) != end - start:
            raise RuntimeError(f"{self.url}: asked for {end - start} bytes at {start}, got {len(data)}")
        self.requests += 1
        self.bytes_fetched += len(data)
        self.spans.append((start, data))

    def _held(self, start: int, end: int) -> Optional[bytes]:
        for s, data in self.spans:
            if s <= start and end <= s + len(data):
                return data[start - s:end - s]
        return None

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        data = self._held(self.pos, self.pos + n)
        if data is None:
            self.fetch(self.pos, self.pos + max(n, 64 << 10))
            data = self._held(self.pos, self.pos + n)
        buf[:n] = data
        self.pos += n
        return n


class Members:
    """A wheel as the facts read it: its name list and the text of the members fetched."""

    def __init__(self, root: Path):
        self.root = root
        meta = json.loads((root / "wheel.json").read_text())
        self.wheel: str = meta["wheel"]
        self.names = set(meta["names"])

    def text(self, path: str) -> str:
        return (self.root / "files" / path).read_text(encoding="utf-8")

    def has(self, path: str) -> bool:
        return (self.root / "files" / path).is_file()


def wheel_file(version: str, project: str = "vllm", opener: Callable = urllib.request.urlopen) -> dict:
    """PyPI's record of the release's Linux x86_64 wheel (url, filename, size, digests)."""
    index = PYPI_JSON.format(project=project)
    with opener(index, timeout=60) as resp:
        doc = json.loads(resp.read())
    files = [f for f in doc.get("releases", {}).get(version, []) if f["filename"].endswith(".whl")]
    for tag in WHEEL_TAGS:
        hit = [f for f in files if f["filename"].endswith(f"{tag}.whl")]
        if hit:
            # a mirror of the JSON API may give the url relative to itself
            return dict(hit[0], url=urllib.parse.urljoin(index, hit[0]["url"]))
    raise RuntimeError(f"PyPI lists no Linux x86_64 wheel of {project}=={version}")


def fetch_members(url: str, size: int, wanted: Callable[[str], bool], dest: Path, wheel: str,
                  opener: Callable = urllib.request.urlopen) -> Tuple[Members, RangeFile]:
    """Read the central directory and the members `wanted` accepts; write them under `dest`."""
    rf = RangeFile(url, size, opener)
    rf.fetch(size - _CD_TAIL, size)
    zf = zipfile.ZipFile(io.BufferedReader(rf, buffer_size=1 << 16))
    infos = [i for i in zf.infolist() if wanted(i.filename)]
    for start, end in _spans(infos, size):
        rf.fetch(start, end)
    tmp = dest.with_name(dest.name + ".part")
    for info in infos:
        out = tmp / "files" / info.filename
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(zf.read(info))
    (tmp / "wheel.json").write_text(json.dumps({"wheel": wheel, "names": sorted(zf.namelist())}, indent=0) + "\n")
    tmp.rename(dest)
    return Members(dest), rf


def _spans(infos: Iterable[zipfile.ZipInfo], size: int) -> List[Tuple[int, int]]:
    """The byte ranges that hold the members (a local header is 30 bytes, its name and extra
    field at most 64 KB more), neighbours merged."""
    out: List[List[int]] = []
    for i in sorted(infos, key=lambda i: i.header_offset):
        start, end = i.header_offset, min(size, i.header_offset + 30 + len(i.filename.encode()) + 1024
                                          + i.compress_size)
        if out and start - out[-1][1] < _GAP:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]
