"""The one exception type for bad user input (files, values, settings), and how input is quoted in it.

Every message names what was wrong, where (file, row, column or field) and what to do. The CLI prints it as a
single line and exits with status 2; nothing is written when it is raised.

A message quotes the value it refuses through `excerpt` (never a bare ``repr``): a 50 MB name or a list of
millions of items is shown as a short excerpt, and building the excerpt never walks the whole value.
"""

from __future__ import annotations

import reprlib

# The most characters of a quoted input value (`excerpt`) and of a whole one-line message (`clip`).
EXCERPT_CHARS = 80
MESSAGE_CHARS = 2000


class InputError(ValueError):
    """Bad input from a user: a file, a curve, a setting. The message is one line and says where."""


def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 2, 4, 4, 4, 4
    r.maxstring = r.maxother = r.maxlong = EXCERPT_CHARS
    return r


_REPR = _bounded_repr()


def _cut(text: str, limit: int) -> str:
    """``text`` cut in the middle to at most ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    cut = f" …[{len(text) - limit} characters left out]… "
    keep = max(limit - len(cut), 2)
    return text[: keep - keep // 3] + cut + text[len(text) - keep // 3:]


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` for an error message, at most about ``limit`` characters: long strings are cut in the
    middle with the count of characters left out, and containers show their first items (bounded work: a
    list of 43 million items, as a YAML alias bomb expands to, is never walked)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value)} characters)"
    shown = _REPR.repr(value)
    if isinstance(value, list | tuple | dict | set) and len(value) > _REPR.maxlist:
        shown += f" ({len(value)} items)"
    return _cut(shown, limit + 40)


def clip(message: str, limit: int = MESSAGE_CHARS) -> str:
    """A one-line message (or a key path) cut in the middle to at most ``limit`` characters: the last resort
    for text that quotes input without `excerpt`; its start (what and where) and end (what to do) are kept."""
    return _cut(message, limit)
