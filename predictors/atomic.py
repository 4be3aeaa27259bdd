"""The one way this package writes a file: atomically, durably, keeping the file's mode.

`atomic_write` writes to a temporary file ``.<name>.<random>.tmp`` beside the target, flushes and fsyncs it,
gives it the mode of the file it replaces (or the mode a plain ``open`` would give a new file: 0666 less the
umask), renames it over the target and fsyncs the folder. A reader sees the old file or the new one, never a
part; a crash before the rename leaves the old file as it was. A killed writer can leave its temporary file
behind: `clean_stale_tmp` removes those (run at the start of every command that writes into a folder).

Errors from the file system (read-only folder, disk full, a folder where a file should be) are turned into
`InputError` naming the path and what to do, and the old file is kept.

Only a regular file or a new path is written (`output_problem`): the rename would otherwise replace a
character device (``/dev/null``, or one made with ``mknod``), a FIFO, a socket or a block device with a
regular file. Those are refused naming what the node is, and left as they are. A symbolic link to a regular
file (or to a new path in an existing folder) is written through: its target is replaced, the link kept; a
link to anything else (``/proc/self/fd/1``: a terminal or a pipe) is refused like its target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from collapse_hpo.predictors.errors import InputError

TMP_SUFFIX = ".tmp"
#: A temporary file of ours older than this (seconds) belongs to a dead writer, whatever its size.
STALE_AFTER_S = 3600.0
#: An empty one older than this (seconds) does too (a live writer fills its file within moments).
EMPTY_STALE_AFTER_S = 60.0


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def describe_os_error(path: str | os.PathLike[str], err: OSError, verb: str = "write") -> str:
    """One line saying why ``path`` cannot be written (``verb``) and what to do (disk full, read-only,
    permission, a folder, missing)."""
    code = err.errno
    if code == errno.ENOSPC or code == errno.EDQUOT:
        why = "the disk is full; free space and run again (the previous file, if any, is kept)"
    elif code == errno.EROFS:
        why = "the file system is read-only; choose a writable folder"
    elif code in (errno.EACCES, errno.EPERM):
        why = "permission denied; choose a folder you can write to"
    elif code == errno.EISDIR:
        why = "it is a folder; give a file name"
    elif code == errno.ENOENT:
        why = "it or its folder does not exist" + ("; create the folder first" if verb == "write" else "")
    else:
        why = f"{err.strerror or type(err).__name__}; choose another path"
    return f"{path}: cannot {verb} ({why})"


_NODE_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def _node_kind(mode: int) -> str | None:
    for test, name in _NODE_KINDS:
        if test(mode):
            return name
    return None


def output_problem(path: str | os.PathLike[str], what: str = "output") -> str | None:
    """Why ``path`` cannot be replaced by a regular file (one line naming what it is), or None when it is a
    regular file, a new path, or a symbolic link to either (written through)."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows links: what a write would reach
    except FileNotFoundError:
        return None
    except OSError as err:
        return describe_os_error(p, err)
    kind = _node_kind(st.st_mode)
    if kind is None:
        return None
    via = f" (a symbolic link to {os.path.realpath(p)})" if p.is_symlink() else ""
    return (f"{p}: the {what} path is {kind}{via}, not a regular file; writing would replace it, so it is "
            "left as it is: give a regular file path")


def target_of(path: str | os.PathLike[str]) -> Path:
    """The path a write to ``path`` replaces: ``path`` itself, or the final target of a symbolic link."""
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def check_writable_file(path: str | os.PathLike[str], what: str = "output") -> Path:
    """Check before any work that ``path`` can be written by `atomic_write`: its folder exists and is
    writable, and ``path`` is not a folder, nor a device, FIFO or socket (`output_problem`). Returns the
    path; raises InputError (one line) otherwise."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: the {what} path is a folder; give a file name inside it")
    problem = output_problem(p, what)
    if problem:
        raise InputError(problem)
    p = target_of(p)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{p}: folder {parent} of the {what} file does not exist; create it first")
    check_writable_dir(parent, what)
    return p


def check_writable_dir(folder: str | os.PathLike[str], what: str = "output") -> Path:
    """Check that files can be created in ``folder`` (an existing folder) by creating and removing a probe
    file. Raises InputError naming the folder and the reason (read-only, permission, full, /sys)."""
    import tempfile  # here, not at the top: `collapse-hpo --help` loads this module and stays fast

    d = Path(folder)
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe.", suffix=TMP_SUFFIX, dir=d)
    except OSError as err:
        raise InputError(describe_os_error(d, err).replace("cannot write", f"cannot write the {what} here")) \
            from None
    try:
        os.write(fd, b"0")
        os.fsync(fd)
    except OSError as err:
        raise InputError(describe_os_error(d, err).replace("cannot write", f"cannot write the {what} here")) \
            from None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return d


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file for writing that replaces ``path`` when the block ends without an error.

    ``mode`` is ``"w"`` (text; ``encoding`` defaults to UTF-8) or ``"wb"``. The new file gets the mode of
    the old one (or 0666 less the umask), is fsynced before the rename, and the folder after it. On any
    error the temporary file is removed and the old file kept; an OSError becomes an InputError (one line).
    """
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    # One mechanism for both: the file is written through the temporary path of `_atomic_path`, which
    # fsyncs it once closed, keeps the old mode, renames, and turns an OSError into one line.
    with _atomic_path(Path(path)) as tmp, open(tmp, mode, **open_kwargs) as fh:
        yield fh


def atomic_write_path(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[str]:
    """Like `atomic_write` for writers that want a file name (matplotlib ``savefig``, ``torch.save``):
    yields the temporary path, which replaces ``path`` (mode kept, fsynced) when the block succeeds."""
    return _atomic_path(Path(path))


@contextlib.contextmanager
def _atomic_path(p: Path) -> Iterator[str]:
    import tempfile  # here, not at the top: `collapse-hpo --help` loads this module and stays fast

    problem = output_problem(p)
    if problem:
        raise InputError(problem)
    p = target_of(p)  # a link to a regular file (or to a new path) is written through, the link kept
    folder = p.parent if str(p.parent) else Path(".")
    try:
        old_mode = stat.S_IMODE(os.stat(p).st_mode)
    except OSError:
        old_mode = _umask_mode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=TMP_SUFFIX, dir=folder)
        os.close(fd)
    except OSError as err:
        raise InputError(describe_os_error(p, err)) from None
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, old_mode)
        os.replace(tmp, p)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise InputError(describe_os_error(p, err)) from None
        raise
    _fsync_dir(folder)


def clean_stale_tmp(folder: str | os.PathLike[str], now: float | None = None) -> list[Path]:
    """Remove the temporary files a killed `atomic_write` left in ``folder`` (not recursive): those named
    ``.<name>.<random>.tmp`` that are empty and older than `EMPTY_STALE_AFTER_S`, or older than
    `STALE_AFTER_S` (a writer still at work is left alone). Returns what was removed."""
    d = Path(folder)
    if not d.is_dir():
        return []
    now = time.time() if now is None else now
    removed = []
    for entry in d.iterdir():
        name = entry.name
        if not (name.startswith(".") and name.endswith(TMP_SUFFIX) and name.count(".") >= 3):
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        age = now - st.st_mtime
        if (st.st_size == 0 and age > EMPTY_STALE_AFTER_S) or age > STALE_AFTER_S:
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.append(entry)
    return removed
