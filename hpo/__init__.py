"""The HPO engine: sweep config, τ-holding search space, Optuna pruner, Ray Tune launch and scheduler, CLI."""
