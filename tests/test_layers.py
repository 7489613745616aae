"""The package's shape, checked on every run: layers import only downward, no module imports
itself back through others, orchestration never shells out to the CLI, and no room grows crowded
(no module over 400 lines, no class over 250; SQL and data files are not Python)."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "servelab"

# Bottom to top. A module may import its own layer and the layers below it.
LAYERS = [
    ("servelab.core",),
    ("servelab.profiles", "servelab.specs"),
    ("servelab.sim.engine",),
    ("servelab.sim.server", "servelab.store"),
    ("servelab.loadgen",),
    ("servelab.analysis",),
    ("servelab.orchestration",),
    ("servelab.commands",),
    ("servelab.cli", "servelab"),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, rank = len(name), i
    assert rank is not None, module
    return rank


def _runtime_nodes(tree):
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only, never executed)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """servelab modules imported anywhere in the file (inside functions too: still a dependency)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("servelab") and name != module:
                found.add(name)
    return found


def test_no_upward_import():
    mods = _modules()
    known = set(mods)
    upward = []
    for module, path in mods.items():
        for target in _imports(module, path, known):
            if target == "servelab" or module.startswith(target + "."):
                continue  # a package's own __init__ (docstring-only ones) is not a layer
            if _layer(target) > _layer(module):
                upward.append(f"{module} imports {target}")
    assert upward == []


def test_no_import_cycle():
    mods = _modules()
    known = set(mods)
    graph = {m: {t for t in _imports(m, p, known) if not m.startswith(t + ".")}
             for m, p in mods.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_orchestration_never_runs_the_cli_as_a_child():
    offenders = [str(p) for p in (PACKAGE / "orchestration").rglob("*.py")
                 if "servelab.cli" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_no_crowded_module_or_class():
    crowded = []
    for module, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n") + 1
        if lines > 400:
            crowded.append(f"{module}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > 250:
                    crowded.append(f"{module}.{node.name}: {size} lines")
    assert crowded == []
