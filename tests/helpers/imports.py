"""The import graph of the `cod` packages, read from the sources with `ast` (nothing is imported),
and the import contract checked over it (tests/project/test_import_contract.py, issue #24).

The top-level folders map to ``cod.*`` through pyproject.toml's package-dir, so tools that
follow folders do not see the layering; this reads the mapping and names every module as
Python imports it.  Every import counts, wherever it stands (module level, inside a function,
under ``if TYPE_CHECKING``): a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

ROOT_PACKAGE = "cod"


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the packages pyproject.toml installs: dotted name -> source file."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs: dict[str, str] = config["package-dir"]
    out: dict[str, Path] = {}
    for package in config["packages"]:
        base = max((p for p in dirs if package == p or package.startswith(p + ".")), key=len)
        folder = root / dirs[base] / Path(*package[len(base):].split(".")[1:])
        for path in sorted(folder.glob("*.py")):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


def _imported(tree: ast.AST, module: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """Absolute names of what ``module`` imports: ``from P import n`` is ``P.n`` when that is
    a module we know, else ``P``."""
    known = set(known)
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return out


def import_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """module -> every module it imports (ours and others', e.g. ``asyncio``)."""
    return {name: _imported(ast.parse(path.read_text(), str(path)), name, path.stem == "__init__", files)
            for name, path in files.items()}


def ours(name: str) -> bool:
    return name == ROOT_PACKAGE or name.startswith(ROOT_PACKAGE + ".")


def within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@dataclass(frozen=True)
class Rule:
    """Modules under ``modules`` may not import anything under ``forbidden`` (but what is
    under ``allowed``), nor (when ``only`` is given) anything of ours outside ``only`` and
    ``modules`` themselves."""

    name: str
    modules: tuple[str, ...]
    forbidden: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    exempt: tuple[str, ...] = ()  # modules under ``modules`` the rule leaves out

    def broken(self, graph: Mapping[str, set[str]]) -> list[str]:
        out = []
        for module, imports in sorted(graph.items()):
            if not within(module, self.modules) or within(module, self.exempt):
                continue
            for target in sorted(imports):
                if within(target, self.forbidden) and not within(target, self.allowed):
                    out.append(f"{self.name}: {module} imports {target}")
                elif (self.only is not None and ours(target)
                      and not within(target, self.only + self.modules)):
                    where = ", ".join(self.only + self.modules)
                    out.append(f"{self.name}: {module} imports {target}, outside {where}")
        return out


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (or a module importing
    itself) among our modules, each as a sorted list (Tarjan, iterative)."""
    nodes = sorted(n for n in graph if ours(n))
    edges = {n: sorted(t for t in graph[n] if t in graph and ours(t)) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = edges[node]
            if i < len(targets):
                work.append((node, i + 1))
                t = targets[i]
                if t not in index:
                    work.append((t, 0))
                elif t in on_stack:
                    low[node] = min(low[node], index[t])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in edges[node]:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found)


def check(graph: Mapping[str, set[str]], rules: Iterable[Rule]) -> list[str]:
    """Every broken rule and every cycle, as readable lines; [] when the contract holds."""
    out = [line for rule in rules for line in rule.broken(graph)]
    out += [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    return out
