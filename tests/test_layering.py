"""The dependency rule, checked on the source (every import, lazy ones included).

predictors is the shared base: it imports only the standard library, numpy, scipy and lmfit, and nothing
else of ours. kernels is a leaf: nothing of ours. trainers may use predictors and kernels, never hpo. hpo
may use everything. (DESIGN.md, "Dependency direction".)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("predictors", "kernels", "trainers", "hpo")
OURS = "collapse_hpo"
#: What each package may import of ours, and which third-party top-level modules (None: any).
ALLOWED: dict[str, tuple[set[str], set[str] | None]] = {
    "predictors": ({"predictors"}, {"numpy", "scipy", "lmfit"}),
    "kernels": ({"kernels"}, None),
    "trainers": ({"trainers", "predictors", "kernels"}, None),
    "hpo": ({"hpo", "trainers", "predictors", "kernels"}, None),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, relative ones resolved to their top level."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, OURS + ".<relative>" if node.level else node.module or ""))
    return out


def _files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_follow_the_dependency_rule(package):
    ours_ok, third_ok = ALLOWED[package]
    bad = []
    for path in _files(package):
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top == "__future__" or top in sys.stdlib_module_names:
                continue
            if top == OURS:
                sub = module.split(".")[1] if "." in module else ""
                if sub != "<relative>" and sub not in ours_ok:
                    bad.append(f"{path.relative_to(REPO)}:{line} imports {module}")
            elif third_ok is not None and top not in third_ok:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_every_package_file_is_checked():
    assert len(_files("predictors")) >= 10 and all(_files(p) for p in PACKAGES)


# ------------------------------------------------------------------------------------------ hpo's rooms
#: The rooms of hpo/ (ARCHITECTURE.md) and the other rooms each may import (its own always). The map is a
#: layering: rule at the bottom, then the two backends, the sweep and its outputs, the replays, and the
#: command line on top. ``cli``, ``extras`` and ``figures`` are hpo/'s top-level modules (the console script;
#: the optional extras' error lines; matplotlib's set-up and PNG writes); ``old-path`` is every deprecated
#: module path (hpo/_moved.py), which no module of ours may import.
HPO_ROOMS: dict[str, set[str]] = {
    "rule": set(),
    "optuna_side": {"rule"},
    "outputs": {"rule", "extras", "figures"},
    "replays": {"rule", "optuna_side", "extras", "figures"},
    "sweep": {"rule", "optuna_side", "outputs", "replays", "extras"},
    "ray_side": {"rule", "optuna_side", "sweep"},
    "integrations": {"rule"},
    "commands": {"rule", "optuna_side", "ray_side", "sweep", "outputs", "replays", "extras", "figures"},
    "cli": {"commands", "sweep"},
    "extras": set(),
    "figures": set(),
    "_moved": set(),
    "old-path": {"_moved"},
    "hpo": set(),
}
#: Third-party libraries a room must never import (lazily or not): the rule and the Optuna side run on the
#: core install, which has no Ray.
HPO_FORBIDDEN: dict[str, set[str]] = {"rule": {"ray"}, "optuna_side": {"ray"}, "outputs": {"ray"},
                                      "integrations": {"ray"}}
#: The rule's modules that may import Optuna (reading a reference from a study); the rest are backend-free.
RULE_OPTUNA = {"reference.py"}
HPO = REPO / "hpo"
TOP_MODULES = {"cli", "extras", "figures", "_moved"}


def _room_of_file(path: Path) -> str:
    """The room of a file of hpo/."""
    rel = path.relative_to(HPO)
    if len(rel.parts) > 1:
        return rel.parts[0]
    if rel.stem == "__init__":
        return "hpo"
    return rel.stem if rel.stem in TOP_MODULES else "old-path"


def _room_of_module(parts: list[str]) -> str:
    """The room of ``collapse_hpo.hpo.<parts...>`` (``parts`` empty: the package itself)."""
    if not parts:
        return "hpo"
    if parts[0] in HPO_ROOMS and parts[0] not in ("old-path", "hpo"):
        return parts[0]
    return "old-path"


def _hpo_imports(path: Path) -> list[tuple[int, str | None, str | None]]:
    """(line, room imported or None, third-party top level or None) of every import of a file of hpo/."""
    out: list[tuple[int, str | None, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: a relative import (write the absolute path)"
            names = [(node.module or "", a.name) for a in node.names]
        else:
            continue
        for module, name in names:
            parts = module.split(".")
            if parts[:2] == [OURS, "hpo"]:
                rest = parts[2:] or ([name] if name and name != "*" else [])
                out.append((node.lineno, _room_of_module(rest), None))
            elif parts[0] != OURS:
                out.append((node.lineno, None, parts[0]))
    return out


def room_graph() -> dict[str, dict[str, list[str]]]:
    """room -> room it imports -> where ("file:line"), over every import of every file of hpo/."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in _files("hpo"):
        room = _room_of_file(path)
        graph.setdefault(room, {})
        for line, target, _ in _hpo_imports(path):
            if target is not None and target != room:
                graph[room].setdefault(target, []).append(f"{path.relative_to(REPO)}:{line}")
    return graph


def violations(graph: dict[str, dict[str, list[str]]], rules: dict[str, set[str]]) -> list[str]:
    """Every arrow of ``graph`` that ``rules`` does not allow (an unknown room allows nothing)."""
    return [f"{room} -> {target} ({', '.join(where)})"
            for room, arrows in sorted(graph.items()) for target, where in sorted(arrows.items())
            if target not in rules.get(room, set())]


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The circles of ``graph`` (each as the list of its rooms, first repeated last), one per back arrow."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(room: str, path: list[str]) -> None:
        state[room] = 1
        for target in sorted(graph.get(room, {})):
            if state.get(target) == 1:
                found.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[room] = 2

    for room in sorted(graph):
        if room not in state:
            visit(room, [room])
    return found


def test_the_checkers_catch_a_forbidden_arrow_and_a_circle():
    fake = {"rule": {"sweep": ["hpo/rule/x.py:3"]}, "sweep": {"rule": ["hpo/sweep/y.py:9"]},
            "outputs": {"commands": ["hpo/outputs/z.py:1"]}, "commands": {"outputs": ["c.py:2"]}}
    assert violations(fake, HPO_ROOMS) == ["outputs -> commands (hpo/outputs/z.py:1)",
                                           "rule -> sweep (hpo/rule/x.py:3)"]
    assert sorted(map(tuple, cycles(fake))) == [("commands", "outputs", "commands"),
                                                ("rule", "sweep", "rule")]
    assert cycles({"a": {"b": []}, "b": {"c": []}, "c": {}}) == []
    assert _room_of_module(["decision"]) == "old-path" and _room_of_module(["rule", "decision"]) == "rule"


def test_the_room_rules_have_no_circle():
    assert cycles({room: {key: [] for key in allowed} for room, allowed in HPO_ROOMS.items()}) == []


def test_hpo_rooms_import_only_what_their_layer_allows():
    graph = room_graph()
    assert set(graph) <= set(HPO_ROOMS), f"a file of hpo/ outside every room: {set(graph) - set(HPO_ROOMS)}"
    assert not violations(graph, HPO_ROOMS), "\n".join(violations(graph, HPO_ROOMS))
    assert cycles(graph) == []


def test_hpo_rooms_never_import_a_forbidden_library():
    bad = []
    for path in _files("hpo"):
        room = _room_of_file(path)
        for line, _, lib in _hpo_imports(path):
            if lib in HPO_FORBIDDEN.get(room, set()):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {lib}")
            if room == "rule" and lib == "optuna" and path.name not in RULE_OPTUNA:
                bad.append(f"{path.relative_to(REPO)}:{line} imports optuna (the rule is backend-free)")
    assert not bad, "\n".join(bad)


def test_nothing_of_ours_imports_an_old_hpo_path():
    """Tests, studies and the other packages import the rooms' paths (an old path warns)."""
    bad = []
    for folder in ("tests", "studies", "predictors", "trainers", "kernels"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[:2] == [OURS, "hpo"]:
                    rest = node.module.split(".")[2:]
                    rooms = [_room_of_module(rest or [a.name]) for a in node.names]
                    if "old-path" in rooms and path.name != "test_moved_paths.py":
                        bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
                elif isinstance(node, ast.Import):
                    bad += [f"{path.relative_to(REPO)}:{node.lineno}" for a in node.names
                            if a.name.split(".")[:2] == [OURS, "hpo"]
                            and _room_of_module(a.name.split(".")[2:]) == "old-path"]
    assert not bad, "old module paths imported at: " + ", ".join(bad)


# ------------------------------------------------------------------- module-level circles, deferred imports
#: What an import of ours inside a function says on one of its lines: why it is not at the top of the module
#: (an optional or slow library it pulls that the importing module must not load, or a circle it would
#: close). Every other import of ours is at module level (issue 22).
DEFERRED = re.compile(r"# deferred: \S")


def _is_ours(node: ast.Import | ast.ImportFrom) -> bool:
    """Whether an import statement imports a module of ours (relative imports included)."""
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == OURS
    return any(a.name.split(".")[0] == OURS for a in node.names)


FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def unmarked_deferred_imports(source: str, name: str) -> list[str]:
    """"name:line" of every import of ours inside a function (``def``, ``async def``, ``lambda``) none of
    whose lines carries a ``# deferred: <why>`` comment."""
    lines = source.splitlines()
    found: list[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if (in_function and isinstance(child, (ast.Import, ast.ImportFrom)) and _is_ours(child)
                    and not any(DEFERRED.search(line) for line in lines[child.lineno - 1:child.end_lineno])):
                found.append(f"{name}:{child.lineno}")
            visit(child, in_function or isinstance(child, FUNCTION))

    visit(ast.parse(source), False)
    return found


def _import_time_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that run when the module is imported: at module level, in ``if``
    (except ``if TYPE_CHECKING:``) and ``try`` blocks; never in a function or class."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            out += _import_time_imports(node.body) + _import_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                out += _import_time_imports(block)
    return out


def module_graph(folders: tuple[str, ...] = PACKAGES) -> dict[str, dict[str, list[str]]]:
    """module -> module of ours it imports when it is imported -> where ("file:line")."""
    files = {}
    for package in folders:
        for path in _files(package):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            files[".".join([OURS, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = path
    graph: dict[str, dict[str, list[str]]] = {}
    for module, path in files.items():
        arrows = graph.setdefault(module, {})
        for node in _import_time_imports(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:  # `from package import submodule` imports the submodule, else the module itself
                base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                if target in files and target != module:
                    arrows.setdefault(target, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    return graph


def test_the_deferred_import_checker_catches_an_unmarked_one():
    fake = ("from collapse_hpo.predictors.errors import InputError\n"  # 1: module level
            "def f():\n"
            "    import numpy\n"  # 3: not ours
            "    from collapse_hpo.trainers.train import train  # deferred: pulls torch (train extra)\n"
            "    from collapse_hpo.hpo.sweep.urls import mask_url\n"  # 5: unmarked
            "    from collapse_hpo.hpo.outputs import (  # deferred: pulls numpy\n"
            "        report,\n"
            "    )\n"
            "    import collapse_hpo.hpo.cli\n"  # 9: unmarked
            "    from collapse_hpo.hpo.rule import judge  # deferred:\n"  # 10: no reason given
            "class C:\n"
            "    from collapse_hpo.hpo.rule import record\n"  # 12: a class body runs at import
            "    async def m(self):\n"
            "        from collapse_hpo.hpo.rule import (\n"  # 14: the comment is on another statement
            "            decision,\n"
            "        )\n"
            "        x = 1  # deferred: not an import\n"
            "        y = lambda: __import__('json')\n")
    assert unmarked_deferred_imports(fake, "f.py") == ["f.py:5", "f.py:9", "f.py:10", "f.py:14"]


def test_every_function_level_import_of_ours_says_why_it_is_deferred():
    bad = []
    for path in _files("hpo"):
        bad += unmarked_deferred_imports(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not bad, ("imports of ours inside a function: move each to the top of its module, or say why it "
                     "cannot be there with a trailing '# deferred: <why>' (an optional library it pulls, a "
                     "circle it closes):\n" + "\n".join(bad))


def test_no_module_of_ours_imports_itself_in_a_circle():
    graph = module_graph()
    assert len(graph) >= 100 and graph["collapse_hpo.hpo.cli"]  # every file is read, the arrows found
    assert cycles(graph) == [], "\n".join(" -> ".join(c) for c in cycles(graph))
