"""The old module paths of hpo/ (before issue 22 put the modules in rooms by role), kept for one release.

Each old path (``collapse_hpo.hpo.pruner``, ...) is a module of two lines that calls `alias`: its import
warns with a DeprecationWarning naming the new path and then *is* the moved module (``sys.modules`` holds
the moved module under the old name), so ``collapse_hpo.hpo.pruner.CollapsePruner is
collapse_hpo.hpo.optuna_side.pruner.CollapsePruner`` and a patch through either path is seen by both.
Nothing in the repository imports an old path (tests/test_layering.py checks it).
"""

from __future__ import annotations

import importlib
import sys
import warnings

#: Old path -> new path, for every old path imported so far.
MOVED: dict[str, str] = {}


def alias(old: str, new: str) -> None:
    """Make module ``old`` the module ``new``, with a DeprecationWarning that names ``new``.

    Called by the module-level code of the old module (``alias(__name__, new)``): the warning points at the
    line that imported the old path (importlib's own frames are skipped).
    """
    MOVED[old] = new
    warnings.warn(f"{old} is deprecated: import {new} (the old path is removed in the next release)",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
