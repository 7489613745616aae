"""The engine is a layer of its own: nothing in ``sim/engine`` imports the HTTP server."""
import ast
from pathlib import Path

import servelab.sim.engine

ENGINE = Path(servelab.sim.engine.__file__).parent


def test_the_engine_never_imports_the_server():
    offenders = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names
                          if n.startswith(("servelab.sim.server", "servelab.store", "aiohttp"))]
    assert offenders == []
