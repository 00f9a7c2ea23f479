#!/usr/bin/env python3
"""Checks that pg_lease's modules depend one way (run by `make test`'s lint step).

Every source file under src/ is a module (src/fence/trigger.rs is
fence::trigger, src/fence/mod.rs is fence). A module depends on another when
it names it through a `crate::` or `super::` path, in a `use` or in code.
Two rules:
  1. the dependency graph has no cycle (a parent module's wiring of its own
     children, and a child's use of its parent's items, are not counted:
     they are one module's inside);
  2. top-level modules depend only on modules declared before them in
     src/lib.rs (the declared order is the layering: pg <- gucs <- errors ...).
Prints every offending edge or cycle and exits 1; prints a one-line summary
and exits 0 otherwise.
"""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return "::".join(parts)


def expand(prefix: str, body: str):
    """Paths named by `prefix::{body}` (nested braces allowed)."""
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    for item in (i.strip() for i in items):
        if not item:
            continue
        m = re.match(r"^([\w:]*?)(?:::)?\{(.*)\}$", item, re.S)
        if m:
            inner = f"{prefix}::{m.group(1)}" if m.group(1) else prefix
            yield from expand(inner, m.group(2))
        else:
            yield f"{prefix}::{item.split(' as ')[0].strip()}"


def paths_in(text: str):
    text = re.sub(r"//[^\n]*", "", text)  # comments (doc comments name modules freely)
    for m in re.finditer(r"\buse\s+((?:crate|super)::[^;]*);", text, re.S):
        stmt = re.sub(r"\s+", "", m.group(1))
        brace = stmt.find("{")
        if brace < 0:
            yield stmt
        else:
            yield from expand(stmt[: brace].rstrip(":"), stmt[brace + 1 : stmt.rfind("}")])
    for m in re.finditer(r"\b((?:crate|super)(?:::\w+)+)", text):
        yield m.group(1)


def resolve(path: str, here: str, modules: set) -> str | None:
    parts = path.split("::")
    if parts[0] == "super":
        base = here.split("::")[:-1] if here else []
        parts = base + parts[1:]
    else:
        parts = parts[1:]
    # The longest prefix that is a module.
    for n in range(len(parts), 0, -1):
        cand = "::".join(parts[:n])
        if cand in modules:
            return cand
    return None


def related(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "::") or b.startswith(a + "::")


def main() -> int:
    files = sorted(SRC.rglob("*.rs"))
    modules = {module_of(f) for f in files}
    edges: dict[str, set] = {m: set() for m in modules}
    for f in files:
        here = module_of(f)
        for p in paths_in(f.read_text()):
            target = resolve(p, here if not f.name == "mod.rs" else here + "::_", modules)
            if target is not None and not related(here, target):
                edges[here].add(target)

    problems = []
    lib = (SRC / "lib.rs").read_text()
    order = re.findall(r"^mod (\w+);", lib, re.M)
    rank = {m: i for i, m in enumerate(order)}
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            ta, tb = a.split("::")[0], b.split("::")[0]
            if ta != tb and ta in rank and tb in rank and rank[tb] > rank[ta]:
                problems.append(f"{a} -> {b}: {tb} is declared after {ta} in src/lib.rs")

    # Cycles (Tarjan's strongly connected components).
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        inner = [f"{a} -> {b}" for a in comp for b in sorted(edges[a]) if b in comp]
        problems.append("cycle: " + "; ".join(inner))

    if problems:
        print("module dependencies that are not one-way:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    n = sum(len(t) for t in edges.values())
    print(f"modules: {len(modules)} modules, {n} dependencies, no cycle, layering as declared in src/lib.rs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
