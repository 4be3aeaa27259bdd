"""Pure numerics of loss-curve collapse (numpy, scipy, lmfit only; never torch, ray or optuna)."""
