"""Laptop side of the probe (pure): a diff's added lines, and the report's ``execution`` block.

`added_lines` reads a unified diff and gives, per file, the line numbers in the
patched file of the lines it adds or changes. `execution_block` turns the
records the probe wrote on a host (runtime.py says what they are) into::

    {"mode": "lines" | "functions" | "off" | "unavailable",
     "pids": [...], "ran": {path: [lines]}, "traced": {path: [lines]},
     "imported": {module: file}, "not_run": {path: reason}, "message": "..."}

``ran`` holds only lines the revision adds (in functions mode: the added lines
held by a function, class or module body that started running). ``traced``
holds lines first seen only while torch.compile traced them or a CUDA graph
was captured: they are not counted as run, and not as never run either.
"""
import json
import re

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

NEVER_IMPORTED = "never imported"
NOT_CHANGED = "imported, but this revision does not change it"
NO_LINE_RAN = "imported, but none of its added lines ran"
ONLY_TRACED = "imported, its added lines only traced (torch.compile or CUDA graph capture), never run"


def diff_path(header):
    """'+++ b/python/sglang/x.py\\t2024-..' -> 'sglang/x.py' (None for /dev/null)."""
    path = header[4:].split("\t")[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    if path == "/dev/null":
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if len(parts) > 1 and parts[0] in ("a", "b"):
        parts = parts[1:]
    if len(parts) > 2 and parts[0] == "python":
        parts = parts[1:]
    return "/".join(parts)


def added_lines(diff_text, offsets=None):
    """{path: [post-image line numbers of '+' lines]} of a unified diff.

    `offsets` {path: [per-hunk offset]} (diffapply's FileResult.offsets) shifts
    each hunk to where it really applied in the file."""
    out = {}
    lines = diff_text.split("\n")
    path = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
            path = diff_path(line)
            if path is not None:
                out.setdefault(path, [])
            hunk = 0
        elif line.startswith("@@") and path is not None and HUNK_RE.match(line):
            m = HUNK_RE.match(line)
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            shift = (offsets or {}).get(path, [])
            at = int(m.group(3)) + (shift[hunk] if hunk < len(shift) else 0)
            hunk += 1
            while (old_left > 0 or new_left > 0) and i + 1 < len(lines):
                i += 1
                body = lines[i]
                kind = body[:1]
                if kind == "+":
                    out[path].append(at)
                    at += 1
                    new_left -= 1
                elif kind == "-":
                    old_left -= 1
                elif kind in (" ", ""):
                    at += 1
                    new_left -= 1
                    old_left -= 1
                # '\ No newline at end of file' counts on neither side
        i += 1
    return {p: sorted(set(v)) for p, v in out.items()}


def hunk_maps(diff_text, offsets=None):
    """{path: [(first old line, old length, new length, {old line: new line} of its context)]}
    of a unified diff, each hunk where it really applied (`offsets` as in `added_lines`)."""
    out = {}
    lines = diff_text.split("\n")
    path = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
            path = diff_path(lines[i - 1]) or diff_path(line)
            out.setdefault(path, [])
            hunk = 0
        elif line.startswith("@@") and path is not None and HUNK_RE.match(line):
            m = HUNK_RE.match(line)
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            shift = (offsets or {}).get(path, [])
            drift = shift[hunk] if hunk < len(shift) else 0
            hunk += 1
            o, n = int(m.group(1)) + drift, int(m.group(3)) + drift
            kept, old_left, new_left = {}, old_len, new_len
            while (old_left > 0 or new_left > 0) and i + 1 < len(lines):
                i += 1
                kind = lines[i][:1]
                if kind in (" ", ""):
                    kept[o] = n
                if kind in (" ", "", "-"):
                    o, old_left = o + 1, old_left - 1
                if kind in (" ", "", "+"):
                    n, new_left = n + 1, new_left - 1
            first = int(m.group(1)) + drift if old_len else int(m.group(1)) + drift + 1
            out[path].append((first, old_len, new_len, kept))
        i += 1
    return out


def carry_lines(lines_by_path, diff_text, offsets=None):
    """{path: [lines]} of a patch already on the files, numbered as they are once the diff
    `diff_text` is applied on top: shifted past its hunks; a line that the diff removes or
    changes is gone (it no longer holds that patch's code)."""
    maps = hunk_maps(diff_text, offsets)
    out = {}
    for path, lines in lines_by_path.items():
        hunks = maps.get(path)
        if hunks is None:
            out[path] = sorted(lines)
            continue
        moved = set()
        for line in lines:
            delta, new = 0, None
            for first, old_len, new_len, kept in hunks:
                if line < first:
                    new = line + delta
                    break
                if line < first + old_len:
                    new = kept.get(line)
                    break
                delta += new_len - old_len
            else:
                new = line + delta
            if new is not None:
                moved.add(new)
        out[path] = sorted(moved)
    return out


def parse_records(files):
    """{process dir: {"process": {...}, "records": [(name, obj)]}} from {"<dir>/<name>": bytes}."""
    procs = {}
    for key in sorted(files):
        folder, _, name = key.partition("/")
        if not name:
            continue
        try:
            obj = json.loads(files[key].decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            obj = {"unreadable": True}
        entry = procs.setdefault(folder, {"process": None, "records": []})
        if name == "process.json":
            entry["process"] = obj
        else:
            entry["records"].append((name, obj))
    return procs


def pid_of(folder, proc):
    if isinstance(proc, dict) and isinstance(proc.get("pid"), int):
        return proc["pid"]
    head = folder.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def collect(procs, plan_modules, added, pids):
    """Walk every process's records; returns the pieces execution_block reports."""
    seen = {"ran": {}, "traced": {}, "files": {}, "pids": set(), "modes": set(), "disabled": []}
    for folder, entry in procs.items():
        pid = pid_of(folder, entry["process"])
        if pids is not None and pid not in pids:
            continue
        seen["pids"].add(pid)
        if entry["process"]:
            seen["modes"].add(entry["process"].get("mode"))
        for name, obj in entry["records"]:
            take_record(seen, name, obj, pid, plan_modules, added)
    return seen


def take_record(seen, name, obj, pid, plan_modules, added):
    if name == "disabled":
        seen["disabled"].append((pid, str(obj.get("reason", "unknown reason"))))
        return
    module = obj.get("module")
    path = obj.get("path") or (plan_modules.get(module) or {}).get("path")
    if not path:
        return
    if name.startswith("M-"):
        seen["files"].setdefault(module, []).append((obj.get("file"), bool(obj.get("same")), obj.get("note") or ""))
        return
    lines = obj.get("lines") if "lines" in obj else [obj.get("line")]
    wanted = set(added.get(path, ()))
    got = {n for n in lines or () if isinstance(n, int) and n in wanted}
    if name.startswith(("L-", "F-")):
        seen["ran"].setdefault(path, set()).update(got)
    elif name.startswith("T-"):
        seen["traced"].setdefault(path, set()).update(got)


def imported_files(plan_modules, files):
    """(imported {module: file}, wrong {path: reason}) from the import records."""
    imported = {}
    wrong = {}
    for module, loads in sorted(files.items()):
        spec = plan_modules.get(module) or {}
        good = [f for f, same, _ in loads if same]
        other = sorted({f for f, same, _ in loads if not same and f})
        imported[module] = good[0] if good else (other[0] if other else None)
        if other:
            wrong[spec.get("path") or module] = "loaded from another file (%s instead of %s)" % (
                other[0], spec.get("expected") or "the patched file")
    return imported, wrong


def mode_of(seen):
    modes = seen["modes"] - {None}
    if not seen["pids"]:
        return "unavailable"
    if len(seen["disabled"]) >= len(seen["pids"]):
        return "unavailable"
    return "functions" if "functions" in modes or not modes else "lines"


def execution_block(files, plan, added, pids=None):
    """The report's execution block from the records `files` of one restart (install.read_records),
    the `plan` the probe ran with, and `added` {path: [lines]}. `pids`: only these processes count."""
    plan_modules = plan.get("modules") or {}
    seen = collect(parse_records(files), plan_modules, added, pids)
    imported, wrong = imported_files(plan_modules, seen["files"])
    ran = {p: sorted(v) for p, v in sorted(seen["ran"].items()) if v}
    traced = {p: sorted(v - seen["ran"].get(p, set())) for p, v in sorted(seen["traced"].items())}
    traced = {p: v for p, v in traced.items() if v}
    not_run = {}
    for module, spec in sorted(plan_modules.items()):
        path = spec.get("path") or module
        if path in ran:
            continue
        if path in wrong:
            not_run[path] = wrong[path]
        elif module not in imported:
            not_run[path] = NEVER_IMPORTED
        elif not added.get(path):
            not_run[path] = NOT_CHANGED
        else:
            not_run[path] = ONLY_TRACED if path in traced else NO_LINE_RAN
    mode = mode_of(seen)
    return {"mode": mode, "pids": sorted(p for p in seen["pids"] if p is not None), "ran": ran,
            "imported": imported, "not_run": not_run, "traced": traced,
            "message": summary(mode, seen, ran, traced)}


def summary(mode, seen, ran, traced):
    procs = len(seen["pids"])
    off = "; ".join("pid %s: %s" % (pid, why) for pid, why in sorted(seen["disabled"], key=str)[:3])
    if not procs:
        return "the probe recorded no process of the server: it never loaded there"
    if mode == "unavailable":
        return "the probe turned itself off in every process (%s)" % off
    n_ran = sum(len(v) for v in ran.values())
    text = "%d added line%s ran in %d file%s, seen in %d process%s" % (
        n_ran, "" if n_ran == 1 else "s", len(ran), "" if len(ran) == 1 else "s", procs, "" if procs == 1 else "es")
    if traced:
        text += "; %d only traced" % sum(len(v) for v in traced.values())
    if off:
        text += "; the probe turned itself off in %s" % off
    return text


def execution_off(mode, message):
    """The block when the probe did not watch: mode 'off' (asked so) or 'unavailable' (could not)."""
    return {"mode": mode, "pids": [], "ran": {}, "imported": {}, "not_run": {}, "traced": {}, "message": message}
