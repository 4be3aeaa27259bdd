"""The dashboard tests' browser: the real `collapse-hpo dashboard` in a subprocess, read by Debian's
headless Chromium (a screenshot or the rendered DOM), and a screenshot's pixels in the figure's colours."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from collapse_hpo.hpo.outputs import dashboard

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def need_chromium() -> None:
    """Fail (not skip) without Chromium: the browser is part of the test set-up."""
    if not (shutil.which("chromium") or os.path.exists("/usr/bin/chromium")):
        pytest.fail("Debian's chromium is needed: apt-get install -y chromium (.ci/run installs it)")


def chromium(args: list[str], profile: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run headless Chromium with ``args`` (e.g. ``--dump-dom URL``) in its own profile folder."""
    exe = shutil.which("chromium") or "/usr/bin/chromium"
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, timeout=timeout, check=False)


@contextmanager
def served(storage: str, *extra: str) -> Iterator[tuple[str, list[str]]]:
    """(the dashboard's URL, the lines it printed up to it) of `collapse-hpo dashboard --storage` on a free
    port; the server is stopped on exit."""
    server = subprocess.Popen(
        [sys.executable, "-m", "collapse_hpo.hpo.cli", "dashboard", "--storage", storage, "--port", "0",
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url, lines, deadline = None, [], time.monotonic() + 60
        while url is None:
            line = server.stdout.readline()
            assert line or server.poll() is None, "dashboard exited: " + "".join(lines)
            assert time.monotonic() < deadline, "no URL printed: " + "".join(lines)
            lines.append(line)
            if "http://127.0.0.1:" in line:
                url = "http://" + line.split("http://", 1)[1].split()[0]
        yield url, lines
    finally:
        server.terminate()
        server.wait(timeout=20)


def trial_pixels(png: Path, box: tuple[int, int, int, int]) -> int:
    """Pixels of the screenshot inside ``box`` (x0, y0, x1, y1) in the figure's trial colours
    (``dashboard._COLORS``; grey left out: the page's text has it)."""
    from PIL import Image

    x0, y0, x1, y1 = box
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)[y0:y1, x0:x1]
    n = 0
    for color in (c for c in dashboard._COLORS if c != "#7f7f7f"):
        rgb = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)])
        n += int((np.abs(img - rgb).sum(axis=2) <= 30).sum())
    return n
