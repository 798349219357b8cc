"""The package's import graph: no circle anywhere, and no import from a lower layer to a higher one,
between the package's folders and between the server's.

Every import counts, those inside functions too (they hide circles, they do not break them).
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "parakeet_stream"

# lowest first: a layer may import its own and the lower ones only
LAYERS = [
    {"arguments", "audio", "host", "client", "sentence_ends", "subtitles", "text"},
    {"model"},
    {"engine", "training"},
    {"server"},
    {"tools"},
]
# inside server/, lowest first; its top modules (app, cli, worker) come after them all
SERVER_LAYERS = ["transport", "streams", "protocols", "operations"]
SHARED = "parakeet_stream.server.context"  # the settings and shared state every server layer is handed


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}  # `from . import hub` names a module
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in _imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
    }


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: in no layer (add its folder to LAYERS)")


def test_no_import_climbs_a_layer():
    upward = [
        f"{a} -> {b}"
        for a, deps in import_graph().items() if a != "parakeet_stream"
        for b in deps if b != "parakeet_stream" and _layer(b) > _layer(a)
    ]
    assert upward == []


def _server_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["parakeet_stream", "server"]:
        return None
    return SERVER_LAYERS.index(parts[2]) if parts[2:3] and parts[2] in SERVER_LAYERS else len(SERVER_LAYERS)


def test_no_import_climbs_a_server_layer():
    upward = [
        f"{a} -> {b}"
        for a, deps in import_graph().items() if _server_layer(a) is not None
        for b in deps if b != SHARED and _server_layer(b) is not None and _server_layer(b) > _server_layer(a)
    ]
    assert upward == []


def test_the_model_package_never_imports_engine_server_or_tools():
    graph = import_graph()
    leaks = [f"{a} -> {b}" for a, deps in graph.items() if a.startswith("parakeet_stream.model")
             for b in deps if not b.startswith(("parakeet_stream.model", "parakeet_stream.audio"))]
    assert leaks == []


def test_no_import_circle():
    graph = import_graph()
    # a package's __init__ re-exporting its modules is not a circle: its modules import siblings directly
    graph = {a: {b for b in deps if not (graph.get(b) is not None and a.startswith(b + "."))}
             for a, deps in graph.items()}
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []
