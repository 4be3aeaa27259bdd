"""Shared test settings. Ray runs without auth in tests; Triton runs in the CPU interpreter."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")


@pytest.fixture
def db_dir(tmp_path):
    """A folder for SQLite files: on tmpfs when there is one (SQLite's fsync per commit is slow on disk)."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="collapse-hpo-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
