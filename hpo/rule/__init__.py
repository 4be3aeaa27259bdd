"""The rule: when to stop a trial (decision), the judge that applies it, the decision record, the reference.

Backend-free: no Ray, and Optuna only where a reference is read from a study (reference.py). It imports
no other part of hpo (tests/test_layering.py; ARCHITECTURE.md).
"""
