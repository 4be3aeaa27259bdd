"""Sub-commands of `collapse-hpo`: one module each (see ``collapse_hpo.hpo.cli``)."""
