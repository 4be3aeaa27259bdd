"""The Ray Tune side: `CollapseScheduler`, the rule (hpo/rule) as a Tune scheduler, its state and its mirror
to an Optuna study. Imports ray: never imported by the core install's paths."""
