"""How the modules of heisd_ros (the node package) and heisd_libero (the LIBERO workbench beside it)
may import each other: no cycles between modules, one direction between folders.

- No two modules import each other, directly or through others: a cycle fails here, naming its
  modules, before it fails at import time.
- The top-level folders of heisd_ros (and its top-level modules policy.py, assembly.py) import only
  downwards, and the workbench (one 'folder' here) sits on top, `FOLDER_IMPORTS`:

      core  <-  models, store, assembly.py  <-  pipeline  <-  policy.py  <-  ros  <-  replay  <-  tools
                                                                         all of it  <-  workbench

  core (the decoding core) imports none of the others; pipeline (offline data, training, bags) no
  policy, ros, replay or tools; the node (ros) no replay or tools, so it runs without either. The
  generated interfaces (`heisd_ros.msg`, `.action`, `.srv`) are imported by the ROS side only.
- The workbench (heisd_libero: LIBERO, the expert, the recorder, the evaluation) may import any of
  heisd_ros; heisd_ros imports the workbench nowhere but in the functions of
  `OPTIONAL_WORKBENCH_IMPORTS`, each inside `optional_dependency` (a node install runs without it).

Both are read from the source (every `import` and `from ... import`, at module level or inside a
function, under TYPE_CHECKING too: a lazy or typing-only import is still a dependency a maintainer
has to follow). Not seen: names built at run time for importlib (tools/cli.py's command table,
replay/playback.py's message classes).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "heisd_ros"
WORKBENCH = REPO / "heisd_libero"
OURS = ("heisd_ros", "heisd_libero")


def _modules() -> dict[str, Path]:
    out = {}
    for path in [*PACKAGE.rglob("*.py"), *WORKBENCH.rglob("*.py")]:
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` lives in (`pkg.mod.Class` -> `pkg.mod`); None outside our packages."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_sites(modules: dict[str, Path]) -> Iterator[tuple[str, int, str]]:
    """(importing module, line, imported name) of every heisd_ros / heisd_libero name each module
    imports; a `from A import b` yields A and A.b (b may be a module or a name in A)."""
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                if name.split(".")[0] in OURS:
                    yield module, node.lineno, name


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, _, name in import_sites(modules):
        owner = _owner(name, modules)
        if owner not in (None, module, *OURS):
            graph[module].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_heisd_ros_modules_import_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 100 and "heisd_ros.core.engine" in graph["heisd_ros.policy"]
    assert "heisd_ros.pipeline.libero_runs" in graph["heisd_libero.eval_evidence"]
    assert cycles(graph) == [], "import cycles among heisd_ros / heisd_libero modules (each line one cycle)"


# ---------------------------------------------------------------------------------------------
# direction between folders

INTERFACES = ("msg", "srv", "action")
"""The generated ROS interfaces (heisd_ros.msg, ...): not in the source tree, one 'folder' here."""
_BELOW_POLICY = {"core", "models", "store", "assembly", "pipeline"}
FOLDER_IMPORTS: dict[str, set[str]] = {
    "core": set(),
    "models": {"core"},
    "store": {"core"},
    "assembly": {"core"},
    "pipeline": {"core", "models", "store", "assembly"},
    "policy": _BELOW_POLICY,
    "ros": _BELOW_POLICY | {"policy", "interfaces"},
    "replay": _BELOW_POLICY | {"policy", "ros", "interfaces"},
    "tools": _BELOW_POLICY | {"policy", "ros", "replay", "interfaces"},
    "workbench": _BELOW_POLICY | {"policy", "ros", "replay", "tools", "interfaces"},
}
"""Folder (or top-level module: policy, assembly; or the whole workbench) -> the other folders it may
import. The workbench may import all of heisd_ros (it is installed on top of the node)."""
WORKBENCH_FOLDER = "workbench"
OPTIONAL_WORKBENCH_IMPORTS = {
    ("heisd_ros.tools.demo", "libero_bag"),  # records the demo's LIBERO bag when none is cached
    ("heisd_ros.tools.demo", "ensure_task_db"),  # builds the committed policy's database from gen-demos
}
"""(heisd_ros module, function) that may import heisd_libero: lazily, for a node command's optional part."""


def folder_of(name: str) -> str:
    """The top-level folder a module or imported name belongs to ('' for the package itself; every
    heisd_libero module is in the one folder 'workbench')."""
    parts = name.split(".")
    if parts[0] == "heisd_libero":
        return WORKBENCH_FOLDER
    if len(parts) < 2:
        return ""
    return "interfaces" if parts[1] in INTERFACES else parts[1]


def direction_violations(sites: list[tuple[str, int, str]], rule: dict[str, set[str]],
                         modules: dict[str, Path]) -> list[str]:  # fmt: skip
    """'file:line: module imports name (folder -> folder)' for every import statement against `rule`
    (of `from A import b, c`, A is named)."""
    found: dict[tuple[str, int, str], str] = {}
    for module, line, name in sites:
        src, dst = folder_of(module), folder_of(name)
        if src and dst and src != dst and dst not in rule.get(src, set()):
            key = (module, line, dst)
            found[key] = min(found.get(key, name), name, key=len)
    out = []
    for (module, line, dst), name in found.items():
        where = modules[module].relative_to(REPO) if module in modules else module
        out.append(f"{where}:{line}: {module} imports {name} ({folder_of(module)} -> {dst})")
    return sorted(out)


def test_the_direction_check_finds_an_upward_import() -> None:
    modules = {"heisd_ros.core.a": PACKAGE / "core" / "a.py"}
    sites = [("heisd_ros.core.a", 3, "heisd_ros.ros.node"), ("heisd_ros.core.a", 4, "heisd_ros.core.b"),
             ("heisd_ros.core.a", 5, "heisd_ros")]
    assert direction_violations(sites, FOLDER_IMPORTS, modules) == [
        "heisd_ros/core/a.py:3: heisd_ros.core.a imports heisd_ros.ros.node (core -> ros)"
    ]
    sites = [("heisd_ros.pipeline.x", 9, "heisd_ros.msg.ArmCommand"), ("heisd_ros.ros.y", 2, "heisd_ros.action")]
    assert [v.split(": ", 1)[1] for v in direction_violations(sites, FOLDER_IMPORTS, {})] == [
        "heisd_ros.pipeline.x imports heisd_ros.msg.ArmCommand (pipeline -> interfaces)"
    ]


def test_the_rule_places_every_folder_and_has_no_cycle() -> None:
    """A new top-level folder or module needs its place in FOLDER_IMPORTS before it can import or
    be imported; and the rule itself only points downwards."""
    present = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert present | {WORKBENCH_FOLDER} == set(FOLDER_IMPORTS), "folders of heisd_ros not placed in FOLDER_IMPORTS (or gone)"
    assert cycles({f: {d for d in allowed if d in FOLDER_IMPORTS} for f, allowed in FOLDER_IMPORTS.items()}) == []
    for folder, allowed in FOLDER_IMPORTS.items():  # layered: a folder may import what its imports may
        for dep in allowed - {"interfaces"}:
            assert FOLDER_IMPORTS[dep] <= allowed, f"{folder} may import {dep} but not all {dep} imports"


def test_heisd_ros_folders_import_in_one_direction() -> None:
    modules = _modules()
    optional = {(module, line) for module, line, _, _ in workbench_imports_in_the_node(modules)}
    sites = [s for s in import_sites(modules) if s[:2] not in optional]
    assert any(folder_of(m) == "ros" and folder_of(n) == "interfaces" for m, _, n in sites)
    assert any(folder_of(m) == WORKBENCH_FOLDER and folder_of(n) == "pipeline" for m, _, n in sites)
    violations = direction_violations(sites, FOLDER_IMPORTS, modules)
    assert violations == [], "imports against the folder direction (module docstring):\n" + "\n".join(violations)


# ---------------------------------------------------------------------------------------------
# the node package's optional use of the workbench


def workbench_imports_in_the_node(modules: dict[str, Path]) -> list[tuple[str, int, str | None, bool]]:
    """(heisd_ros module, line, enclosing function or None at module level, whether the import sits
    in a `with optional_dependency(...)` block) of every import of heisd_libero in heisd_ros."""
    out = []
    for module, path in modules.items():
        if not module.startswith("heisd_ros"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if not any(n.split(".")[0] == "heisd_libero" for n in names):
                continue
            function, guarded, up = None, False, parents.get(node)
            while up is not None:
                if isinstance(up, ast.With) and any(
                        isinstance(i.context_expr, ast.Call) and getattr(i.context_expr.func, "id", "") == "optional_dependency"
                        for i in up.items):
                    guarded = True
                if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)) and function is None:
                    function = up.name
                up = parents.get(up)
            out.append((module, node.lineno, function, guarded))
    return out


def test_the_node_imports_the_workbench_only_lazily_where_listed() -> None:
    found = workbench_imports_in_the_node(_modules())
    at_module_level = [f"{m}:{line}" for m, line, function, _ in found if function is None]
    assert not at_module_level, f"heisd_ros imports heisd_libero at module level: {at_module_level}"
    assert {(m, function) for m, _, function, _ in found} == OPTIONAL_WORKBENCH_IMPORTS, \
        "heisd_ros imports heisd_libero outside OPTIONAL_WORKBENCH_IMPORTS (or a listed place no longer does)"
    unguarded = [f"{m}:{line}" for m, line, _, guarded in found if not guarded]
    assert not unguarded, f"not inside `with optional_dependency(...)` (a missing workbench must say what to install): {unguarded}"
