"""The dependency rule, checked on the source (every import, lazy ones included).

predictors is the shared base: it imports only the standard library, numpy, scipy and lmfit, and nothing
else of ours. kernels is a leaf: nothing of ours. trainers may use predictors and kernels, never hpo. hpo
may use everything. (DESIGN.md, "Dependency direction".)
"""

from __future__ import annotations

import ast
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
#: command line on top. ``cli`` and ``extras`` are hpo/'s two top-level modules (the console script; the
#: optional extras' error lines); ``old-path`` is every deprecated module path (hpo/_moved.py), which no
#: module of ours may import.
HPO_ROOMS: dict[str, set[str]] = {
    "rule": set(),
    "optuna_side": {"rule"},
    "outputs": {"rule", "extras"},
    "replays": {"rule", "optuna_side", "extras"},
    "sweep": {"rule", "optuna_side", "outputs", "replays", "extras"},
    "ray_side": {"rule", "optuna_side", "sweep"},
    "integrations": {"rule"},
    "commands": {"rule", "optuna_side", "ray_side", "sweep", "outputs", "replays", "extras"},
    "cli": {"commands", "sweep"},
    "extras": set(),
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
TOP_MODULES = {"cli", "extras", "_moved"}


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
