"""One agent session on a LocalHost, driven by hand: the laptop's end of the channel
(what Remote does), and the requests a deploy sends on it."""
from __future__ import annotations

import os
import subprocess

from fleetpatch import protocol, remote, steps
from support.localhost import LocalHost, job


class Agent:
    """The laptop's end of one agent session, driven by hand (what Remote does)."""

    def __init__(self, lh: LocalHost, boot: bool = True):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        self.proc = subprocess.Popen([str(lh.python), "-c", remote.BOOTSTRAP], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     start_new_session=True)
        if boot:   # else the test sends the boot stream itself
            self.send(remote.boot_stream(str(lh.state)))

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, req: dict) -> None:
        self.send(remote.request_line(req))

    def reply(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            assert line, self.proc.stderr.read().decode()
            r = remote.parse_reply(line)
            if r is not None:
                return r

    def result(self) -> dict:
        while True:
            r = self.reply()
            if r.get("t") == "result":
                assert r["ok"], r
                return r["result"]

    def vanish(self) -> int:
        """The laptop is gone: both ends of its channel close. The agent's exit status."""
        self.proc.stdin.close()
        self.proc.stdout.close()
        return self.proc.wait(timeout=60)


def requests(lh):
    """This run's probe+lock and apply requests, built as a deploy builds them."""
    j, host = job(lh)
    base = steps.base_request(host, j)
    probe = dict(base, op="probe", files=steps.revision_files(j), content=True,
                 lock=protocol.LockClaim(token=j.token, holder="test laptop pid 1", force=False))

    def apply(reply):
        plan, revision = steps.make_plan(j, host, reply)
        files = [protocol.ApplyFile(path=r.path, before=steps.sha256(steps.file_bytes(reply, r.path)),
                                    after=steps.sha256(r.new), content=protocol.pack(r.new)) for r in plan.changes]
        return dict(base, op="apply", package_dir=reply["package_dir"], name=j.patch.name, rev=revision.rev,
                    label=plan.label, diff_sha256=revision.diff_sha256, files=files)

    def follow(out):
        return dict(base, op="follow", **protocol.log_window(out["restart"]), timeout=20,
                    ready_line="The server is fired up", server_info_url=None)

    return base, probe, apply, follow
