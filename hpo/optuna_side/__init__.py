"""The Optuna side: `CollapsePruner`, the rule (hpo/rule) as an Optuna pruner, and its writes to the study."""
