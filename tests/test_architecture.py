"""The package's import graph, read with ``ast``: no cycles, no private names across modules,
and the layers the README's architecture table states.

Edges are every ``import`` and ``from ... import`` of a ``tensoropt`` module, at module level
or inside a function (a lazy import runs too, only later), except under
``if TYPE_CHECKING:``. Importing ``a.b.c`` also runs the ``__init__`` of every package on the
way that the importer is not inside of, so those are edges as well.

Private means a leading underscore (dunder names excepted): a module may not import another
module's private name, and a private module (``capture/_blocks.py``) may be imported only by
its own package's ``__init__``.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tensoropt"


@dataclass
class ImportGraph:
    modules: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=dict)
    private: set[tuple[str, str]] = field(default_factory=set)      # (importer, what it imports)
    external: dict[str, set[str]] = field(default_factory=dict)     # module -> top-level third-party names

    def reachable(self, start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for m in self.edges.get(todo.pop(), ()):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(self.edges.get(v, ())):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

        for v in sorted(self.modules):
            if v not in index:
                visit(v)
        return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def build_graph(root: Path) -> ImportGraph:
    """The import graph of the package at ``root`` (a directory with ``__init__.py``)."""
    name = root.name
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    g = ImportGraph(modules)
    for mod, path in modules.items():
        is_package = path.name == "__init__.py"
        package = mod if is_package else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        targets: list[str] = []
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    if top == name:
                        targets.append(alias.name)
                    else:
                        g.external.setdefault(mod, set()).add(top)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != name:
                    g.external.setdefault(mod, set()).add(source.split(".")[0])
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    if sub in modules:
                        targets.append(sub)
                    else:
                        targets.append(source)
                        if _private(alias.name):
                            g.private.add((mod, sub))
        for target in targets:
            while target not in modules:            # a name imported from a module
                target = target.rpartition(".")[0]
            parts = target.split(".")
            for k in range(1, len(parts) + 1):
                step = ".".join(parts[:k])
                if step == mod or (mod + ".").startswith(step + "."):
                    continue                         # itself, or a package it is inside of
                g.edges.setdefault(mod, set()).add(step)
                if _private(parts[k - 1]) and ".".join(parts[:k - 1]) != mod:
                    g.private.add((mod, step))        # a private module, not from its package's __init__
    return g


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return build_graph(PACKAGE)


def test_no_import_cycles(graph):
    assert graph.cycles() == []


def test_no_private_name_crosses_a_module(graph):
    assert graph.private == set(), "import the public name (rename what is shared)"


def test_the_engine_stands_alone(graph):
    for mod in graph.modules:
        if _within(mod, ("tensoropt.engine",)):
            assert all(_within(m, ("tensoropt.engine",)) for m in graph.edges.get(mod, ())), mod
            assert "torch" not in graph.external.get(mod, set()), mod


# The runners and launchers: what the planning side must never reach.
RUNNERS = ("tensoropt.apply", "tensoropt.launch", "tensoropt.validate", "tensoropt.profile.run",
           "tensoropt.profile.cli", "tensoropt.cli", "tensoropt.train")
# The planning side, torch-free: from operator graphs to plans and their collectives.
TORCH_FREE = ("tensoropt.placement", "tensoropt.training", "tensoropt.traffic", "tensoropt.strategy",
              "tensoropt.execution", "tensoropt.costmodel", "tensoropt.planner", "tensoropt.plan_builder",
              "tensoropt.pipeline", "tensoropt.mesh_search", "tensoropt.search_jobs", "tensoropt.fallback", "tensoropt.references", "tensoropt.comms",
              "tensoropt.budget", "tensoropt.frontiers", "tensoropt.plan")


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_planning_never_reaches_the_runners(graph):
    for start in ("tensoropt.search", "tensoropt.scaling", "tensoropt.calibration", "tensoropt.pricing", *TORCH_FREE):
        up = {m for m in graph.reachable(start) if _within(m, RUNNERS)}
        assert not up, f"{start} reaches {sorted(up)}"


@pytest.mark.parametrize("start", TORCH_FREE)
def test_planning_modules_do_not_import_torch(graph, start):
    users = sorted(m for m in graph.reachable(start) if "torch" in graph.external.get(m, set()))
    assert not users, f"{start} imports torch through {users}"


# ---------------------------------------------------------------------------------- the README's table

README = PACKAGE.parent / "README.md"


def readme_layers(text: str) -> list[tuple[str, list[tuple[str, bool]]]]:
    """``[(layer, [(module, whole package?), ...]), ...]`` from the table under "How it works",
    in row order: a ``name.py`` or ``dir/name.py`` cell entry is that module of ``tensoropt/``,
    a ``tensoropt/dir/`` one a package and everything in it."""
    section = text.split("## How it works", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        names = []
        for item in re.findall(r"`([^`]+)`", cells[1]):
            item = item.removeprefix("tensoropt/")
            if item.endswith("/"):
                names.append(("tensoropt." + item.strip("/").replace("/", "."), True))
            else:
                module = "tensoropt." + item.removesuffix(".py").replace("/", ".")
                names.append((module.removesuffix(".__init__"), False))
        rows.append((cells[0], names))
    return rows


def _row_of(module: str, rows) -> int | None:
    """The row that names ``module`` itself, else the row of its innermost package."""
    best, best_len = None, -1
    for k, (_, names) in enumerate(rows):
        for n, package in names:
            if module == n and not package:
                return k
            if package and (module == n or module.startswith(n + ".")) and len(n) > best_len:
                best, best_len = k, len(n)
    return best


def test_readme_table_places_every_module_and_every_import_points_up(graph):
    rows = readme_layers(README.read_text())
    assert len(rows) >= 8, rows
    row = {m: _row_of(m, rows) for m in graph.modules if m != "tensoropt"}
    assert [m for m, r in row.items() if r is None] == [], "add these modules to the README's table"
    wrong = [f"{m} ({rows[row[m]][0]}) imports {t} ({rows[row[t]][0]})"
             for m in row for t in graph.edges.get(m, ()) if t in row and row[t] > row[m]]
    assert wrong == []


def test_readme_check_fails_on_a_table_in_the_wrong_order(graph):
    text = README.read_text()
    rows = readme_layers(text)
    upside_down = rows[::-1]
    row = {m: _row_of(m, upside_down) for m in graph.modules if m != "tensoropt"}
    assert any(row[t] > row[m] for m in row for t in graph.edges.get(m, ()) if t in row)
    assert _row_of("tensoropt.profile.data", rows) != _row_of("tensoropt.profile.run", rows)


# ---------------------------------------------------------------------------------- the checker


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_checker_finds_a_planted_cycle(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import g\n\ndef f():\n    return g()\n",
        "b.py": "def g():\n    from .sub.c import h\n    return h()\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ..a import f\n\ndef h():\n    return 1\n",
        "d.py": "from . import a\n",
    })
    g = build_graph(root)
    assert g.cycles() == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    (root / "sub" / "c.py").write_text("def h():\n    return 1\n")
    assert build_graph(root).cycles() == []


def test_checker_counts_a_package_init_on_the_way(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "low.py": "from .high.tools import x\n",
        "high/__init__.py": "from ..low import *\n",
        "high/tools.py": "x = 1\n",
    })
    assert build_graph(root).cycles() == [["pkg.high", "pkg.low"]]


def test_checker_finds_private_imports(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "def _helper():\n    return 1\n",
        "b.py": "from .a import _helper\n",
        "inner/__init__.py": "from ._impl import thing\n",
        "inner/_impl.py": "thing = 1\n",
        "inner/sibling.py": "from ._impl import thing\n",
        "c.py": "import pkg.inner._impl\n",
        "ok.py": "from .inner import thing\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from .a import _helper\n",
    })
    assert build_graph(root).private == {("pkg.b", "pkg.a._helper"), ("pkg.inner.sibling", "pkg.inner._impl"),
                                         ("pkg.c", "pkg.inner._impl")}
