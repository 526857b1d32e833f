"""The README and docs/ are what a user reads: they name only commands and flags the CLI
has, their links lead somewhere, the README stays short, and the repo's example inventory
never dials anything."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import yaml

from support.paths import REPO

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
MINE = [*DOCS, "CHANGELOG.md", "hosts.yaml", "src/fleetpatch/cli.py", "src/fleetpatch/cli_common.py",
        "src/fleetpatch/cli_hosts.py", "src/fleetpatch/cli_fleet.py", "src/fleetpatch/report.py",
        "src/fleetpatch/rollout.py", "src/fleetpatch/ssh_errors.py", "src/fleetpatch/textsafe.py",
        "src/fleetpatch_demo/run.py"]


def test_no_reference_to_a_contract_document_users_do_not_have():
    for rel in MINE:
        text = (REPO / rel).read_text().lower()
        assert "contract" not in text, rel


def test_the_benchmark_tables_live_in_bench_with_a_summary_and_a_link():
    readme = (REPO / "README.md").read_text()
    assert "| hosts | fleetpatch |" not in readme
    assert "[bench/FIGURES.md](bench/FIGURES.md)" in readme and "[bench/README.md](bench/README.md)" in readme
    figures = (REPO / "bench" / "FIGURES.md").read_text()
    assert "| hosts | fleetpatch | baseline (1 ssh/host) | Ansible |" in figures
    assert "| 32 | 16.10 s (13.07–16.30) | 9.07 s | 41.45 s |" in figures


def test_a_bare_status_in_the_repo_fails_at_once_naming_each_host():
    doc = yaml.safe_load((REPO / "hosts.yaml").read_text())
    assert all(h["address"].endswith(".invalid") for h in doc["hosts"].values())
    env = {k: v for k, v in os.environ.items() if k != "FLEETPATCH_INVENTORY"}
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fleetpatch", "status"], cwd=REPO, capture_output=True, text=True,
                       timeout=60, env=env)
    took = time.monotonic() - t
    assert r.returncode == 1, r
    assert took < 15, f"took {took:.1f}s: it dialled something"
    for name in doc["hosts"]:
        line = next(line for line in r.stdout.splitlines() if line.startswith(f"{name} ("))
        assert "unreachable" in r.stdout and "resolve" in line.lower() or "Name or service not known" in line, line
    assert r.stdout.splitlines()[-1].startswith("FAILED on 2 of 2 hosts: gpu-a01 (unreachable), gpu-a02 (unreachable)")


# Flags the docs name that belong to other programs (SGLang's launch, journalctl, the bench),
# and the misspelling the docs show being caught.
FOREIGN_FLAGS = {"--speculative-eagle-topk", "--speculative-num-steps", "--speculative-num-draft-tokens",
                 "--speculative-disable-batch-threshold", "--disable-overlap-schedule", "--unit",
                 "--fleetpatch-before", "--host", "--skip-server-warmup", "--api-key",   # (vllm serve's too)
                 # vllm serve's
                 "--speculative-config", "--enforce-eager", "--served-model-name", "--model",
                 "--tensor-parallel-size"}
PROGRAM_FLAGS = {"--help", "-h", "--version", "-V", "--list", "-l"}


def code_texts(text: str):
    """Every inline code span and every line of a fenced block: where commands are written."""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield line
        else:
            yield from re.findall(r"`([^`\n]+)`", line)


def invocations(code: str, commands: set):
    """(command, the words after it up to the next shell separator) for each command written in `code`:
    after `fleetpatch` or `invoke`, or a span that starts with a command's name."""
    for m in re.finditer(r"(?:^|(?<=[\s($]))(?:fleetpatch|invoke)\s+(--?[a-zA-Z-]+|[a-z][a-z-]*)", code):
        rest = re.split(r"&&|\|\||;|#|\s\|\s|`", code[m.end():])[0]
        yield m.group(1), rest
    first = code.split()[0] if code.split() else ""
    if first in commands:
        yield first, re.split(r"&&|;|#|`", code[len(first):])[0]


def repo_tasks() -> dict:
    """The tasks tasks.py adds for `invoke` in the repo (the bench), with their flags, read without importing it."""
    import ast
    out = {}
    for node in ast.parse((REPO / "tasks.py").read_text()).body:
        if isinstance(node, ast.FunctionDef) and any("task" in ast.dump(d) for d in node.decorator_list):
            out[node.name.replace("_", "-")] = {"--" + a.arg.replace("_", "-") for a in node.args.args[1:]}
    return out


def test_the_docs_name_only_commands_and_flags_the_cli_has():
    from fleetpatch.cli import ns, task_flags
    commands = set(ns.task_names)
    flags = {c: set(task_flags(c)) | {"--help", "-h"} for c in commands}
    for name, its_flags in repo_tasks().items():   # `invoke bench` (only `invoke` has them; close enough)
        commands.add(name)
        flags[name] = its_flags | {"--help", "-h"}
    any_flag = set().union(*flags.values()) | PROGRAM_FLAGS | FOREIGN_FLAGS
    wrong = []
    for rel in DOCS:
        for code in code_texts((REPO / rel).read_text()):
            for cmd, rest in invocations(code, commands):
                if cmd.startswith("-"):
                    if cmd not in PROGRAM_FLAGS:
                        wrong.append(f"{rel}: `{code}`: fleetpatch has no option {cmd}")
                    continue
                if cmd not in commands:
                    wrong.append(f"{rel}: `{code}`: fleetpatch has no command {cmd!r}")
                    continue
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
                    if flag not in flags[cmd]:
                        wrong.append(f"{rel}: `{code}`: {cmd} has no flag {flag}")
            lone = re.match(r"--[a-z][a-z0-9-]*", code)
            if lone and lone.group(0) not in any_flag:
                wrong.append(f"{rel}: `{code}`: no fleetpatch command has the flag {lone.group(0)}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_is_at_most_200_lines():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= 200, f"README.md has {n} lines; move reference prose to docs/"


def heading_anchors(text: str) -> set:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+\s+(.+)$", text, re.M)}


def test_the_readme_s_status_table_names_every_status():
    from fleetpatch.errors import Status
    text = (REPO / "README.md").read_text()
    table = text.split("The statuses:", 1)[1].split("Exit codes:", 1)[0]
    named = set()
    for row in re.findall(r"(?m)^\| (`.+?) \|", table):
        named |= set(re.findall(r"`([a-z-]+)`", row))
    assert named == {s.value for s in Status}, (f"missing: {sorted({s.value for s in Status} - named)}; "
                                                f"not statuses: {sorted(named - {s.value for s in Status})}")


def test_the_patch_yaml_key_table_has_every_key_the_loader_takes():
    from fleetpatch.patchset import _TOP_KEYS
    text = (REPO / "docs/patches.md").read_text()
    table = text.split("| key | meaning |", 1)[1].split("\n\n", 1)[0]
    named = {key for row in re.findall(r"(?m)^\| (`.+?) \|", table) for key in re.findall(r"`([a-z_]+)`", row)}
    assert set(_TOP_KEYS) <= named, f"docs/patches.md's key table lacks {sorted(set(_TOP_KEYS) - named)}"


def test_hosts_yaml_says_where_the_demo_writes_its_inventory(monkeypatch, tmp_path):
    from fleetpatch_demo.run import default_root
    comment = " ".join(line.lstrip("# ") for line in (REPO / "hosts.yaml").read_text().splitlines()
                       if line.startswith("#"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_root() / "hosts.yaml" == tmp_path / "fleetpatch/demo/hosts.yaml"
    assert "$XDG_STATE_HOME/fleetpatch/demo/hosts.yaml" in comment, comment
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_root() / "hosts.yaml" == tmp_path / ".local/state/fleetpatch/demo/hosts.yaml"
    assert "~/.local/state/fleetpatch/demo/hosts.yaml" in comment, comment


def test_every_link_of_the_docs_leads_to_a_file_and_heading_that_exist():
    broken = []
    for rel in DOCS + ["CHANGELOG.md", "patches/README.md"]:
        page = REPO / rel
        for section in re.findall(r"README's \"([^\"]+)\"", page.read_text()):   # a section named, not linked
            if section.lower().replace(" ", "-") not in heading_anchors((REPO / "README.md").read_text()):
                broken.append(f"{rel}: the README has no section {section!r}")
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{rel}: ({target}): no such file")
            elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text()):
                broken.append(f"{rel}: ({target}): no heading with that anchor in {path or rel}")
    assert not broken, "\n".join(broken)


def test_the_fast_tier_command_is_the_same_in_the_readme_and_the_internals():
    """README.md and docs/internals.md both give the fast tier's command line; one process count."""
    pattern = r"python3 -m pytest -q -n \d+(?: --dist \w+)? tests/fast"
    readme = set(re.findall(pattern, (REPO / "README.md").read_text()))
    internals = set(re.findall(pattern, " ".join((REPO / "docs" / "internals.md").read_text().split())))
    assert len(readme) == 1 and readme == internals, (readme, internals)


def test_ci_runs_the_readmes_full_test_command():
    """.ci/run ends with the README's command for everything, word for word."""
    readme = (REPO / "README.md").read_text()
    full = re.findall(r"^(python3 -m pytest -q(?: -n \d+ --dist \w+)?)\s+# everything", readme, re.M)
    ci_last = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert len(full) == 1 and ci_last == full[0], (full, ci_last)
