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
