"""The README's "Your first patch", done as written on real sshd hosts: fetch, the scratch git
index, the diff, the README's own patch.yaml, check-patch, deploy-patch, a verified verdict on
both EAGLE paths. If the README's commands or path forms stop working, this fails."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from support.paths import REPO  # noqa: E402
README = (REPO / "README.md").read_text()

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"),
                                reason="needs root and /usr/sbin/sshd")

# What a person does in $EDITOR: one log line as the first statement of each worker's __init__.
EDIT = r'''
import sys
for path, cls in (("sglang/srt/speculative/eagle_worker.py", "EAGLEWorker"),
                  ("sglang/srt/speculative/eagle_worker_v2.py", "EAGLEWorkerV2")):
    text = open(path).read()
    body = text.index("    ):\n", text.index("def __init__(", text.index(f"class {cls}("))) + len("    ):\n")
    open(path, "w").write(text[:body] + f'        logger.info("worker-hello: {cls} (first line of __init__)")\n'
                          + text[body:])
'''


def readme_block(lang: str, starts: str) -> str:
    for body in re.findall(rf"```{lang}\n(.*?)```", README, re.S):
        if body.startswith(starts):
            return body
    raise AssertionError(f"README.md has no ```{lang} block starting with {starts!r}")


def test_the_readmes_first_patch_verifies_on_both_paths(operator, tmp_path):
    work = operator.workdir
    hosts = "v1a,v2a"            # v1a runs EAGLEWorker, v2a EAGLEWorkerV2

    fetch = re.search(r"fleetpatch (fetch --hosts \S+)", README).group(1).split()
    r = operator.run(*fetch[:-1], hosts)
    assert r.code == 0, r
    assert (work / ".fleetpatch/sources/v1a/sglang/srt/speculative/eagle_worker.py").is_file()
    assert (work / ".fleetpatch/sources/v1a/fetch.json").is_file()

    script = readme_block("sh", "cp -r .fleetpatch/sources/")
    script = (script.replace("gpu-a01", "v1a").replace("/tmp/a01", str(tmp_path / "a01"))
              .replace("~/fleet", str(work)))
    script = re.sub(r"^\$EDITOR .*$", lambda m: "python3 - <<'EOF'\n" + EDIT + "EOF", script, flags=re.M)
    done = subprocess.run(["bash", "-euc", script], cwd=work, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    diff = (work / "patches/worker-hello/sglang-0.5.9.r1.diff").read_text()
    assert "--- a/sglang/srt/speculative/eagle_worker.py" in diff and "+++ b/sglang/srt/speculative/eagle_worker_v2.py" in diff
    (work / "patches/worker-hello/patch.yaml").write_text(readme_block("yaml", "name: worker-hello"))

    r = operator.run("check-patch", "--patch", "worker-hello", "--hosts", hosts)
    assert r.code == 0, r
    assert {r.host(h)["status"] for h in ("v1a", "v2a")} == {"applies"}, r

    r = operator.run("deploy-patch", "--patch", "worker-hello", "--hosts", hosts)
    assert r.code == 0, r
    for host, path in (("v1a", "EAGLEWorker"), ("v2a", "EAGLEWorkerV2")):
        assert (r.host(host)["status"], r.host(host)["executed_path"]) == ("verified", path), r
        assert r.host(host)["patch"] == "worker-hello@1"
    assert r.output.splitlines()[-1].startswith("OK: deploy-patch succeeded on all 2 hosts"), r
