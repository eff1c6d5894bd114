"""The shape of the code, checked from the source: imports point down the layers and never in a circle,
no product file passes 600 lines, no ten lines stand twice, the similarity floor's default is written
once, and only `services/runtime` builds Kafka clients. Re-run with `pytest tests/unit/test_layout.py`."""

from __future__ import annotations

import ast
import collections
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("schemas", "policies", "matching", "sim", "services", "streams", "infra")
# Lower layers never import higher ones; a package may import its own layer's others (acyclically).
LAYERS = {
    "schemas": 0,
    "policies": 1,
    "matching": 1,
    "sim": 1,
    "services.runtime": 2,
    "services": 3,  # every service but runtime
    "streams": 3,
    "infra": 4,
}
MAX_LINES = 600
SAME_LINES = 10
KAFKA_CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}


def _modules() -> dict[str, Path]:
    out = {}
    for root in PRODUCT:
        for path in sorted((ROOT / root).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                yield target


GRAPH = {m: set(_imports(m, p)) for m, p in MODULES.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "services" and len(parts) > 1 else parts[0]


def _layer(module: str) -> int:
    package = _package(module)
    return LAYERS.get(package, LAYERS[package.split(".")[0]])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert _cycles(GRAPH) == []


def test_no_package_imports_itself_through_others() -> None:
    packages: dict[str, set[str]] = collections.defaultdict(set)
    for module, targets in GRAPH.items():
        packages[_package(module)] |= {_package(t) for t in targets} - {_package(module)}
    assert _cycles(dict(packages)) == []


def test_imports_point_down_the_layers() -> None:
    upward = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if _layer(t) > _layer(m))
    assert upward == []


def test_the_light_client_stands_alone() -> None:
    leaks = []
    for path in sorted((ROOT / "client").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                )
                leaks += [f"{path.name}: {n}" for n in names if n.split(".")[0] in PRODUCT]
    assert leaks == []


def test_no_product_file_over_600_lines() -> None:
    paths = [*MODULES.values(), *sorted((ROOT / "client").rglob("*.py"))]
    long = {str(p.relative_to(ROOT)): n for p in paths if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _significant(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines that carry code: no blanks, comments, imports, lone brackets."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = " ".join(line.split())
        if not text or text.startswith(("#", "import ", "from ")) or re.fullmatch(r"[\[\](){},:]+", text):
            continue
        out.append((number, text))
    return out


def test_no_ten_lines_written_twice() -> None:
    seen: dict[tuple[str, ...], tuple[str, int]] = {}
    twice = []
    for module, path in MODULES.items():
        if module.endswith(".ports"):
            continue  # Protocols: their implementations repeat their signatures by definition
        lines = _significant(path)
        last_end = -1
        for i in range(len(lines) - SAME_LINES + 1):
            window = tuple(text for _, text in lines[i : i + SAME_LINES])
            where = (str(path.relative_to(ROOT)), lines[i][0])
            first = seen.setdefault(window, where)
            if first != where and where[1] > last_end:  # one report per run of repeated lines
                twice.append(f"{where[0]}:{where[1]} repeats {first[0]}:{first[1]}")
                last_end = lines[i + SAME_LINES - 1][0]
    assert twice == []


def test_the_similarity_floors_default_is_written_once() -> None:
    places = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == 0.92 and type(node.value) is float
    ]
    assert len(places) == 1 and places[0].startswith("schemas/descriptor.py:"), places


def test_only_the_runtime_builds_kafka_clients() -> None:
    built = []
    for module, path in MODULES.items():
        if module.startswith("services.runtime"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in KAFKA_CLIENTS:
                    built.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert built == []
