"""The README's runnable examples, read from the README itself so that a test runs what the reader sees."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks(heading: str) -> list[str]:
    """The ```python blocks of the README section that starts with the line ``heading`` (up to the next
    heading of the same or a higher level), in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n" + heading + "\n")
    level = heading.split(" ", 1)[0]
    ends = [m.start() for m in re.finditer(r"\n#{1," + str(len(level)) + "} ", text[start + 1:])]
    section = text[start: start + 1 + ends[0]] if ends else text[start:]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, f"README section {heading!r} has no python block"
    return blocks


def readme_block(heading: str) -> str:
    """The first ```python block of the README section that starts with the line ``heading``."""
    return readme_blocks(heading)[0]


def run_readme_block(heading: str, name: str = "readme_example") -> dict:
    """Execute the section's first python block as it is; its namespace."""
    namespace: dict = {"__name__": name}
    exec(compile(readme_block(heading), f"README.md ({heading})", "exec"), namespace)
    return namespace
