"""The package's shape, checked on every run. Every package of src/servelab is a key of ``ALLOWED``
and imports only its own modules and the packages listed for it there (the map itself has no
cycle), and no module imports itself back through others. Nothing but the CLI's own modules starts
servelab's CLI as a child process, in any spelling. No function in src/servelab or bench/ passes
60 lines but the few of ``LONG_FUNCTIONS``, each with its reason; bench/ reaches servelab through
public names only; no room grows crowded (no module over 400 lines, no class over 250; SQL and data
files are not Python). Each checker takes the sources of a tree (``read_tree`` reads a folder), so
the tests at the bottom feed each one a made-up tree that breaks its rule and see it fail."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
BENCH = REPO / "bench"
ROOT = "servelab"   # its __init__ is __version__ only: anyone may read it, it imports nothing

_CORE = "servelab.core"
_PROFILES, _SPECS = "servelab.profiles", "servelab.specs"
_ENGINE, _SIM_SERVER, _STORE = "servelab.sim.engine", "servelab.sim.server", "servelab.store"
_LOADGEN = "servelab.loadgen"   # its shared modules: options, messages, profile files, search
_CLIENT, _WORKER = "servelab.loadgen.client", "servelab.loadgen.worker"
_MASTER, _WEB = "servelab.loadgen.master", "servelab.loadgen.web"
_PLUGIN, _USERS = "servelab.loadgen.plugin", "servelab.loadgen.users"   # the Locust glue, on top
_ANALYSIS, _ORCHESTRATION = "servelab.analysis", "servelab.orchestration"
_COMMANDS, _CLI = "servelab.commands", "servelab.cli"

# Each package (or module) -> what it may import besides itself and ROOT. A key covers every
# module under it but those under a longer key; an entry allows that package or module and what
# lies under it. Bottom to top, as docs/architecture.md tells the layers; siblings of one layer
# may not import each other unless listed here.
ALLOWED: dict[str, set[str]] = {
    _CORE: set(),
    _PROFILES: {_CORE},
    _SPECS: {_CORE},
    "servelab.sim": set(),   # the docstring over engine and server
    _ENGINE: {_CORE, _SPECS},
    # A sibling in layer 4, listed: the exporter writes the span names store.spans decodes, so
    # vLLM's span vocabulary is written once; store.spans imports nothing of sim.
    _SIM_SERVER: {_CORE, _PROFILES, _SPECS, _ENGINE, "servelab.store.spans"},
    _STORE: {_CORE},
    _LOADGEN: {_CORE, _PROFILES, _STORE},
    _CLIENT: {_CORE, _STORE},   # HTTP and SSE, no Locust: nothing else of loadgen
    _WORKER: {_CORE, _PROFILES, _STORE, _LOADGEN, _CLIENT},
    _MASTER: {_CORE, _PROFILES, _SPECS, _STORE, _LOADGEN, _CLIENT},
    _WEB: {_CORE, _PROFILES, _STORE},
    _USERS: {_CORE, _LOADGEN, _WORKER},
    _PLUGIN: {_CORE, _PROFILES, _STORE, _LOADGEN, _WORKER, _MASTER, _WEB, _USERS},
    _ANALYSIS: {_CORE, _SPECS, _STORE, _LOADGEN},
    _ORCHESTRATION: {_CORE, _PROFILES, _SPECS, _ENGINE, _STORE, _LOADGEN, _ANALYSIS,
                     "servelab.loadgen.master.scraper"},   # the server log's /metrics reader
    _COMMANDS: {_CORE, _PROFILES, _SPECS, _SIM_SERVER, _STORE, _LOADGEN, _ANALYSIS,
                _ORCHESTRATION},
    _CLI: {_COMMANDS},
}

# The CLI is ``servelab`` (the console script), ``python -m servelab`` / ``servelab.cli`` and the
# command modules; those modules define it, everyone else may not start it as a child.
CLI_DEFINERS = (_CLI, _COMMANDS)
CLI_MODULE = re.compile(r"servelab(\.cli|\.commands(\.\w+)*)?$")
# Entry points of their own (a __main__, one process each), not the CLI: the simulator
# (architecture.md: the runner starts it as ``python -m servelab.commands.sim``).
ENTRY_POINTS = {"servelab.commands.sim"}
# Modules whose argv lists are documents, not children: compose.py writes the containers'
# commands into docker-compose.yml; Docker runs them in their own containers.
DOCUMENTS = {"servelab.orchestration.compose"}
RUNS_A_SHELL = {"system", "popen", "getoutput", "getstatusoutput", "create_subprocess_shell"}
STARTS_A_PROCESS = RUNS_A_SHELL | {
    "run", "Popen", "call", "check_call", "check_output", "spawn", "create_subprocess_exec",
    "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv",
    "spawnve", "spawnvp", "spawnl"}
CLI_TEXT = [re.compile(p) for p in (
    r"servelab\.cli\b",                              # python -m servelab.cli, import strings
    r"""which\(\s*["']servelab["']""",               # shutil.which("servelab")
    r"-m\s*servelab(?![\w.])",                       # "python -m servelab run" in any string
    r"""["']-m["']\s*,\s*["']servelab["']""",        # [..., "-m", "servelab", ...]
)]
SHELL_CLI = re.compile(r"(^|[\s;&|(`])(\S*/)?servelab(\s|$)")

MAX_FUNCTION_LINES = 60
# At most five, each with its reason.
LONG_FUNCTIONS = {
    "src/servelab/loadgen/client/framing.py::Framing.take":
        "one pass over a socket read on the measured hot path: a helper is a Python call per "
        "chunk (issue 19 measured CPU per chunk against the reference client)",
    "src/servelab/loadgen/client/request.py::_attempt":
        "the per-chunk read loop of one request on the same measured path: its state lives in "
        "locals, and a split would add a call per chunk",
}


@dataclass(frozen=True)
class Source:
    name: str          # dotted module name (src) or the file's path (bench)
    label: str         # the path from the repository (or a made-up tree's folder), for messages
    text: str
    is_package: bool


def _label(path: Path, tree: Path) -> str:
    """The path from the repository (the real tree) or from the tree's folder (a made-up one)."""
    return str(path.relative_to(REPO if path.is_relative_to(REPO) else tree))


def read_tree(src: Path, top: str = ROOT) -> dict[str, Source]:
    """Every module of the package ``top`` under ``src``, by dotted name."""
    out = {}
    for path in sorted((src / top).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = Source(".".join(parts), _label(path, src),
                                      path.read_text(encoding="utf-8"), is_package)
    return out


def read_scripts(folder: Path) -> dict[str, Source]:
    """The scripts of a folder (bench/), by path."""
    return {_label(p, folder.parent): Source(_label(p, folder.parent), _label(p, folder.parent),
                                             p.read_text(encoding="utf-8"), False)
            for p in sorted(folder.glob("*.py"))}


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


def imports(src: Source, known: set[str]) -> set[str]:
    """servelab modules imported anywhere in the file (inside functions too: still a dependency)."""
    package = src.name if src.is_package else src.name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(src.text)):
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
            if name.startswith(ROOT) and name != src.name:
                found.add(name)
    return found


def _under(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def owner(module: str, allowed: dict[str, set[str]]) -> str | None:
    """The key of ``allowed`` a module belongs to: the longest that covers it (ROOT: itself)."""
    keys = [k for k in allowed if _under(module, k)]
    return max(keys, key=len) if keys else (ROOT if module == ROOT else None)


def unlisted(tree: dict[str, Source], allowed: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} belongs to no package of ALLOWED: add its package to ALLOWED with what "
                  "it may import" for m in tree if owner(m, allowed) is None)


def forbidden_imports(tree: dict[str, Source], allowed: dict[str, set[str]]) -> list[str]:
    known, bad = set(tree), []
    for module, src in tree.items():
        mine = owner(module, allowed)
        if mine is None:
            continue   # unlisted() names it
        for target in sorted(imports(src, known)):
            if (target == ROOT and mine != ROOT) or owner(target, allowed) == mine:
                continue
            if not any(_under(target, e) for e in allowed.get(mine, ())):
                bad.append(f"{module} imports {target}: not in ALLOWED[{mine!r}]")
    return bad


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    found = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def import_cycles(tree: dict[str, Source]) -> list[str]:
    known = set(tree)
    return _cycles({m: {t for t in imports(s, known) if not _under(m, t)} for m, s in tree.items()})


def map_cycles(allowed: dict[str, set[str]]) -> list[str]:
    """The map read as a graph of its keys: a layering has no way back up."""
    return _cycles({k: {owner(e, allowed) for e in v} - {k, None} for k, v in allowed.items()})


# ---- the CLI as a child --------------------------------------------------------------------
def _strings(node) -> list[str | None]:
    """A list/tuple's elements as text where they are constants (None where not)."""
    return [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None
            for e in node.elts]


def _runs_the_cli(argv: list[str | None]) -> bool:
    """An argv list that starts the CLI: ``servelab ...`` or ``<python> -m servelab[.cli] ...``."""
    first = argv[0] if argv else None
    if first is not None and first.rsplit("/", 1)[-1] == ROOT:
        return True
    for i, arg in enumerate(argv):
        module = argv[i + 1] if arg == "-m" and i + 1 < len(argv) else (
            arg[2:] if arg and arg.startswith("-m") and len(arg) > 2 else None)
        if module and CLI_MODULE.match(module) and module not in ENTRY_POINTS:
            return True
    return False


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _cli_spellings(src: Source) -> list[str]:
    found = [f"{src.label}: {p.pattern}" for p in CLI_TEXT if p.search(src.text)]
    for node in ast.walk(ast.parse(src.text)):
        if isinstance(node, (ast.List, ast.Tuple)) and src.name not in DOCUMENTS \
                and _runs_the_cli(_strings(node)):
            found.append(f"{src.label}:{node.lineno}: an argv that starts the CLI")
        if isinstance(node, ast.Call) and _call_name(node) in STARTS_A_PROCESS:
            args = [*node.args, *(k.value for k in node.keywords)]
            lists = [n for a in args for n in ast.walk(a) if isinstance(n, (ast.List, ast.Tuple))]
            # a command line only where a shell reads one (a spawn's first text is its label)
            shell = _call_name(node) in RUNS_A_SHELL or any(
                k.arg == "shell" and getattr(k.value, "value", False) is True
                for k in node.keywords)
            texts = [n.value for a in args for n in ast.walk(a)
                     if shell and isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if any(SHELL_CLI.search(t) for t in texts) or any(
                    _runs_the_cli(_strings(n)) for n in lists):
                found.append(f"{src.label}:{node.lineno}: {_call_name(node)}(...) starts the CLI")
    return found


def cli_children(tree: dict[str, Source]) -> list[str]:
    """Every place outside the CLI's own modules that starts servelab's CLI as a child."""
    return [hit for m, src in tree.items() if not any(_under(m, d) for d in CLI_DEFINERS)
            for hit in _cli_spellings(src)]


# ---- sizes ---------------------------------------------------------------------------------
def _functions(node, prefix=""):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from _functions(child, prefix + child.name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def long_functions(sources: dict[str, Source], exceptions: dict[str, str]) -> list[str]:
    """Functions over MAX_FUNCTION_LINES (``def`` to last line, decorators not counted)."""
    out = []
    for src in sources.values():
        for name, node in _functions(ast.parse(src.text)):
            size = node.end_lineno - node.lineno + 1
            if size > MAX_FUNCTION_LINES and f"{src.label}::{name}" not in exceptions:
                out.append(f"{src.label}::{name}: {size} lines")
    return out


def crowded(tree: dict[str, Source]) -> list[str]:
    out = []
    for src in tree.values():
        lines = src.text.count("\n") + 1
        if lines > 400:
            out.append(f"{src.name}: {lines} lines")
        for node in ast.walk(ast.parse(src.text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250:
                out.append(f"{src.name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    return out


def private_reaches(scripts: dict[str, Source]) -> list[str]:
    """Where a script imports a private servelab name (a ``_module`` or ``_name``) or reads one
    through a servelab module it imported."""
    out = []
    for src in scripts.values():
        tree, aliases = ast.parse(src.text), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [(a.name, a.asname or a.name.split(".")[0]) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(ROOT):
                pairs = [(f"{node.module}.{a.name}", a.asname or a.name) for a in node.names]
            else:
                continue
            for dotted, alias in pairs:
                if not _under(dotted, ROOT):
                    continue
                aliases.add(alias)
                if any(p.startswith("_") and not p.startswith("__") for p in dotted.split(".")):
                    out.append(f"{src.label}:{node.lineno}: imports {dotted}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                out.append(f"{src.label}:{node.lineno}: reads {node.value.id}.{node.attr}")
    return out


# ---- the rules, on the real tree -----------------------------------------------------------
def test_every_package_is_in_the_map():
    assert unlisted(read_tree(SRC), ALLOWED) == []


def test_imports_follow_the_map():
    assert forbidden_imports(read_tree(SRC), ALLOWED) == []


def test_the_map_is_a_layering():
    assert map_cycles(ALLOWED) == []
    assert imports(read_tree(SRC)[ROOT], set(read_tree(SRC))) == set()


def test_no_import_cycle():
    assert import_cycles(read_tree(SRC)) == []


def test_nothing_runs_the_cli_as_a_child():
    assert cli_children(read_tree(SRC)) == []


def test_no_long_function():
    assert len(LONG_FUNCTIONS) <= 5
    sources = {**read_tree(SRC), **read_scripts(BENCH)}
    assert long_functions(sources, LONG_FUNCTIONS) == []
    sized = {f"{s.label}::{n}" for s in sources.values() for n, _ in _functions(ast.parse(s.text))}
    assert set(LONG_FUNCTIONS) <= sized   # an exception outlives its function: drop it


def test_bench_reaches_servelab_through_public_names():
    assert private_reaches(read_scripts(BENCH)) == []


def test_no_crowded_module_or_class():
    assert crowded(read_tree(SRC)) == []


# ---- each rule can fail ----------------------------------------------------------------------
def _fake(tmp_path: Path, files: dict[str, str]) -> dict[str, Source]:
    for rel, text in {"servelab/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return read_tree(tmp_path)


def test_an_unlisted_package_fails(tmp_path):
    tree = _fake(tmp_path, {"servelab/core/a.py": "", "servelab/extras/b.py": ""})
    assert unlisted(tree, ALLOWED) == ["servelab.extras.b belongs to no package of ALLOWED: add "
                                       "its package to ALLOWED with what it may import"]


def test_a_sibling_or_upward_import_fails(tmp_path):
    tree = _fake(tmp_path, {
        "servelab/store/__init__.py": "", "servelab/store/rows.py": "",
        "servelab/store/runs.py": "from servelab.sim.server import stream\n",
        "servelab/sim/server/__init__.py": "", "servelab/sim/server/stream.py": "",
        "servelab/sim/server/spans.py": "from servelab.store import rows\n",
        "servelab/core/x.py": "def f():\n    import servelab.store.rows\n"})
    assert forbidden_imports(tree, ALLOWED) == [
        "servelab.core.x imports servelab.store.rows: not in ALLOWED['servelab.core']",
        "servelab.sim.server.spans imports servelab.store.rows: not in "
        "ALLOWED['servelab.sim.server']",
        "servelab.store.runs imports servelab.sim.server.stream: not in ALLOWED['servelab.store']"]


def test_a_cycle_fails(tmp_path):
    tree = _fake(tmp_path, {"servelab/core/a.py": "from servelab.core import b\n",
                            "servelab/core/b.py": "from servelab.core import a\n"})
    assert import_cycles(tree) == ["servelab.core.a -> servelab.core.b -> servelab.core.a"]
    assert map_cycles({"a": {"b"}, "b": {"a"}}) == ["a -> b -> a"]


def test_every_cli_spelling_fails(tmp_path):
    spellings = [
        'import subprocess\nsubprocess.run(["python", "-m", "servelab.cli", "run"])\n',
        'import subprocess, sys\nsubprocess.run([sys.executable, "-m", "servelab", "run"])\n',
        'import sys\ncmd = [sys.executable, "-mservelab", "run"]\n',
        'cmd = ["servelab", "run", "--profile", "p.yaml"]\n',
        'cmd = ("/usr/local/bin/servelab", "sim")\n',
        'import os\nos.system("cd /tmp && servelab run --profile p.yaml")\n',
        'import subprocess\nsubprocess.run("python -m servelab run", shell=True)\n',
        'import subprocess\nsubprocess.Popen("nice -n 5 servelab sim --port 0", shell=True)\n',
        'import shutil\nexe = shutil.which("servelab")\n',
        'from servelab.core.procs import spawn\nspawn("x", ["python", "-m", "servelab.commands.run"])\n',
    ]
    files = {f"servelab/orchestration/m{i}.py": s for i, s in enumerate(spellings)}
    tree = _fake(tmp_path, files)
    caught = {h.split(":")[0] for h in cli_children(tree)}
    assert caught == {f"servelab/orchestration/m{i}.py" for i in range(len(spellings))}


def test_children_that_are_not_the_cli_pass(tmp_path):
    tree = _fake(tmp_path, {
        "servelab/orchestration/ok.py":
            'import sys\nfrom servelab.core.procs import spawn\n'
            'spawn("sim", [sys.executable, "-m", "servelab.commands.sim", "--port", "0"])\n'
            'spawn("locust", [sys.executable, "-m", "locust", "-f", "x.py"])\n'
            'spawn("gpu", [sys.executable, "-m", "servelab.orchestration.gpu_telemetry"])\n'
            'print("run `servelab compose generate` first")\n'
            'spawn("servelab sim for bf16", ["python", "-m", "servelab.commands.sim"])\n',
        "servelab/orchestration/compose.py": 'SERVICE = {"command": ["servelab", "run"]}\n',
        "servelab/commands/run.py": 'HELP = ["servelab", "run"]\n'})
    assert cli_children(tree) == []


def test_a_61_line_function_fails(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    tree = _fake(tmp_path, {"servelab/core/a.py": f"@staticmethod\ndef short():\n{body}\n"
                            f"class C:\n    def long(self):\n{body.replace('    ', '        ')}"
                            "        return 1\n"})
    assert long_functions(tree, {}) == ["servelab/core/a.py::C.long: 61 lines"]
    assert long_functions(tree, {"servelab/core/a.py::C.long": "a reason"}) == []


def test_a_bench_script_is_held_to_both_rules(tmp_path):
    (tmp_path / "bench").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "bench" / "b.py").write_text(
        "from servelab.core import procs\nfrom servelab.core._x import y\n"
        f"def main():\n{body}    return procs._private\n", encoding="utf-8")
    scripts = read_scripts(tmp_path / "bench")
    assert long_functions(scripts, {}) == ["bench/b.py::main: 62 lines"]
    assert private_reaches(scripts) == ["bench/b.py:2: imports servelab.core._x.y",
                                        "bench/b.py:64: reads procs._private"]


def test_a_crowded_module_fails(tmp_path):
    tree = _fake(tmp_path, {"servelab/core/a.py": "x = 1\n" * 400})
    assert crowded(tree) == ["servelab.core.a: 401 lines"]
