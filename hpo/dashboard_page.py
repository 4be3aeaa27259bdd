"""Deprecated path of `collapse_hpo.hpo.outputs.dashboard_page` (issue 22, hpo/_moved.py)."""

from collapse_hpo.hpo._moved import alias

alias(__name__, "collapse_hpo.hpo.outputs.dashboard_page")
