"""Shared test settings. Ray runs without auth in tests; Triton runs in the CPU interpreter."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
