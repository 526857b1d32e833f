"""fleetpatch's probe, functions mode's rewrite (Python 3.8+, stdlib only): where the guards go.

Shipped as the first part of the probe's runtime (install.runtime_source: this file, then
runtime.py, run as one source in the server), and run by the agent at install time, which
rewrites and compiles the watched modules for its own build (install.probe_plan). Pure: an
ast in, the ast with its guards and the guard table out. `ast` is imported inside each
function: a server start that loads the agent's compiled module never imports it.
"""

PROBE_NAME = "__fleetpatch_probe__"   # the guard list in a patched module's globals (functions mode)


def holder_names(source, filename, lines):
    """The names (last part of the qualname) of the functions that hold `lines` in `source`."""
    import ast
    return holder_names_in(ast.parse(source, filename), lines)


def holder_names_in(tree, lines):
    """holder_names of a parsed module."""
    import ast
    return {qual.rsplit(".", 1)[-1] for node, qual, _, _ in units_holding(tree, lines)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def function_nodes(tree, names):
    """The function nodes of `tree` whose name is in `names` (every function when `names` is empty)."""
    import ast
    return [(node, qual, first) for node, qual, first, _ in scopes(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (not names or node.name in names)]


def scopes(tree, lines=None):
    """(node, qualname, first line, last line) of the module and of every class and function in it;
    with `lines` (sorted line numbers), only those whose span holds one of them (the others hold no
    added line, nor does anything nested in them).

    Only statement lists are walked (a def or class is a statement, never inside an expression),
    and only compound statements are looked into: a walk of every node took the agent 20 ms for a
    1000-line module, a look into every statement 3 ms."""
    import ast
    import bisect
    compound = tuple(getattr(ast, name) for name in ("If", "For", "AsyncFor", "While", "With", "AsyncWith", "Try",
                                                     "TryStar", "Match") if hasattr(ast, name))

    def holds(first, last):
        if lines is None:
            return True
        at = bisect.bisect_left(lines, first)
        return at < len(lines) and lines[at] <= last

    out = [(tree, "<module>", 1, float("inf"))]
    todo = [(tree.body, "")]
    while todo:
        body, prefix = todo.pop()
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not holds(stmt.lineno, stmt.end_lineno):
                    continue
                qual = prefix + stmt.name
                out.append((stmt, qual, stmt.lineno, stmt.end_lineno))
                todo.append((stmt.body, qual + ("." if isinstance(stmt, ast.ClassDef) else ".<locals>.")))
            elif isinstance(stmt, compound) and holds(stmt.lineno, stmt.end_lineno):
                todo.extend((block, prefix) for block in sub_bodies(stmt))
    return out


def units_holding(tree, lines):
    """[(node, qualname, first line, [added lines it holds directly])] for bodies holding added lines.

    A line belongs to the innermost class or function whose span holds it;
    decorators and lambdas belong to the body around them."""
    lines = sorted(lines)
    all_scopes = scopes(tree, lines)
    held = {}
    for line in lines:
        inside = [s for s in all_scopes if s[2] <= line <= s[3]]
        if inside:
            best = max(inside, key=lambda s: s[2])
            held.setdefault(id(best[0]), (best, []))[1].append(line)
    return [(s[0], s[1], s[2], found) for s, found in held.values()]


def guard_statement(k, line):
    """``if P[k]: P[0](k)`` placed at `line` (the line of the statement it precedes)."""
    import ast
    guard = ast.parse("if %s[%d]:\n    %s[0](%d)\n" % (PROBE_NAME, k, PROBE_NAME, k)).body[0]
    for node in ast.walk(guard):
        if "lineno" in node._attributes:
            node.lineno = node.end_lineno = line
            node.col_offset = node.end_col_offset = 0
    return guard


def body_start(node):
    """Where a body's first guard goes: after a docstring and (module) __future__ imports."""
    import ast
    body = node.body
    at = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        at = 1
    if isinstance(node, ast.Module):
        while at < len(body) and isinstance(body[at], ast.ImportFrom) and body[at].module == "__future__":
            at += 1
    return at


def stmt_first(stmt):
    """A statement's first line: its first decorator's for a decorated def or class."""
    return min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", ())])


def sub_bodies(stmt):
    """A compound statement's statement lists, in source order (body, handlers, cases, else, finally)."""
    import ast
    found = [getattr(stmt, field, None) for field in ("body", "orelse", "finalbody")]
    found += [h.body for h in getattr(stmt, "handlers", ())] + [c.body for c in getattr(stmt, "cases", ())]
    return sorted((b for b in found if isinstance(b, list) and b and isinstance(b[0], ast.stmt)),
                  key=lambda b: stmt_first(b[0]))


def line_spot(unit, line):
    """(statement list, index) of the statement before which a guard says `line` ran, or None for a
    line that holds no code of this unit (a comment, a blank line).

    The guard goes before the innermost statement that holds the line, in that statement's own
    block, so it runs exactly when that statement starts. Approximated, for the lines of a
    compound statement's header that are no statement of their own: a test or iterable (``if``,
    ``elif``, ``while``, ``for``, ``with``, a decorator, a docstring) counts as run when its
    statement starts (a ``while`` test's later evaluations are not told apart); an ``except``
    clause's type, a ``case`` pattern and an ``else:`` or ``finally:`` line when the block under
    it starts (a clause tried but not taken is not seen); a def's header (arguments, defaults)
    when its body starts; a lambda or comprehension inside a statement when that statement starts."""
    import ast
    block = unit.body
    first_at = body_start(unit)
    if line < stmt_first(block[0]) and not isinstance(unit, ast.Module):
        return block, first_at          # the def or class header
    while True:
        holder = None
        for i, stmt in enumerate(block):
            if stmt_first(stmt) <= line <= stmt.end_lineno:
                holder = i
                break
        if holder is None:
            return None
        stmt = block[holder]
        if block is unit.body and holder < first_at:
            return block, first_at      # a docstring or a __future__ import: they run as the body starts
        subs = [] if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or line == stmt.lineno else sub_bodies(stmt)
        inner = next((b for b in subs if any(stmt_first(s) <= line <= s.end_lineno for s in b)), None)
        if inner is not None:
            block, first_at = inner, 0
            continue
        after = next((b for b in subs if stmt_first(b[0]) > line), None)
        if after is None or after is subs[0]:
            return block, holder        # a simple statement, or its compound statement's own header
        return after, 0                 # an except/case/else/finally line: the block under it


def rewrite_tree(tree, lines, counted):
    """Put the guards into `tree` (a module's ast) and return its guard table, index k-1 for guard k:
    (kind, qualname, first line, added lines, the index of its body's start guard).

    kind "S": a body that holds added lines starts (counted: how often it ran, for `unproven`);
    "L": a statement that holds added lines starts (they ran); "C": a sibling's function named in
    `counted` ("*": every function) starts (counted). With `lines` empty the module is a sibling."""
    table = []
    spots = {}      # id(statement list) -> (the list, {index: [guard numbers]})

    def add(block, at, k):
        spots.setdefault(id(block), (block, {}))[1].setdefault(at, []).append(k)

    if lines:
        for node, qual, first, held in units_holding(tree, lines):
            start_k = len(table) + 1
            table.append(("S", qual, first, sorted(held), start_k))
            add(node.body, body_start(node), start_k)
            by_spot = {}
            for line in sorted(held):
                spot = line_spot(node, line)
                if spot is not None:
                    by_spot.setdefault((id(spot[0]), spot[1]), (spot, []))[1].append(line)
            for (block, at), found in by_spot.values():
                table.append(("L", qual, first, found, start_k))
                add(block, at, len(table))
    else:
        names = set(counted) - {"*"}
        for node, qual, first in function_nodes(tree, names):
            table.append(("C", qual, first, [], len(table) + 1))
            add(node.body, body_start(node), len(table))
    for block, at_index in spots.values():
        for at in sorted(at_index, reverse=True):
            line = stmt_first(block[at]) if at < len(block) else block[-1].lineno
            for k in reversed(at_index[at]):    # the start guard first: it was added first
                block.insert(at, guard_statement(k, line))
    return table


def scope_codes(code):
    """`code` and the class bodies in it, nested ones too: the scopes that are not functions."""
    found, todo = [], [code]
    while todo:
        each = todo.pop()
        found.append(each)
        todo.extend(c for c in each.co_consts if hasattr(c, "co_code") and not c.co_flags & 0x1)   # 0x1: CO_OPTIMIZED
    return found


def guards_in_functions_only(part):
    """Whether no guard of `part` (the code of the lines the agent kept, install.spliced_module) is in
    its module or class bodies, which `splice` does not carry over: it would never run."""
    return not any(PROBE_NAME in code.co_names for code in scope_codes(part))


def splice(whole, part):
    """`whole` (the code of a module, or of a class body in it) with each function of `part` (the same
    scope compiled from the lines the agent kept, its guards in) in place of its namesake: same name
    and first line, the one and only such code object in the same scope, with the same free variables
    and arguments; class bodies matched and spliced in turn. None where any of that fails."""
    if not guards_in_functions_only(part):
        return None
    consts = list(whole.co_consts)
    for new in part.co_consts:
        if not hasattr(new, "co_code"):
            continue
        at = [i for i, old in enumerate(consts) if hasattr(old, "co_code") and old.co_name == new.co_name
              and old.co_firstlineno == new.co_firstlineno]
        if len(at) != 1:
            return None
        old = consts[at[0]]
        if new.co_flags & 0x1:      # a function: what is nested in it comes with it
            if (old.co_flags & 0x1, old.co_freevars, old.co_argcount, old.co_kwonlyargcount) != \
                    (1, new.co_freevars, new.co_argcount, new.co_kwonlyargcount):
                return None
            consts[at[0]] = new
        else:
            consts[at[0]] = splice(old, new)
            if consts[at[0]] is None:
                return None
    return whole.replace(co_consts=tuple(consts))
