"""The code's shape, checked: no import circles in the operator, the job runtime or the stack's scripts, and
modules of the operator and the runtime a newcomer can read alone (about 400 lines at most)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"eos_operator": REPO / "operator" / "eos_operator", "eos_job": REPO / "jobs" / "eos_job"}
# The stack's scripts: no circles either (their line limit is not checked yet: node.py and kube.py are longer).
CIRCLE_FREE = {**PACKAGES, "eos_stack": REPO / "stack" / "eos_stack"}
MAX_LINES = 420


def module_name(package: str, root: Path, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(package: str, root: Path, path: Path) -> set[str]:
    """Modules of the same package that ``path`` imports (relative and absolute; any depth, any place)."""
    me = module_name(package, root, path)
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != package:
                continue
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)   # `from . import children`
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == package)
    return out


def graph(package: str, root: Path) -> dict[str, set[str]]:
    modules = {module_name(package, root, p): p for p in root.rglob("*.py")}
    return {name: {t for t in imports_of(package, root, p) if t in modules and t != name}
            for name, p in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


@pytest.mark.parametrize("package", sorted(CIRCLE_FREE))
def test_no_import_circle(package):
    cycle = find_cycle(graph(package, CIRCLE_FREE[package]))
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"


def test_the_circle_check_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_modules_are_small_enough_to_read_alone(package):
    root = PACKAGES[package]
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}; split them by concern"
