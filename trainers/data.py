"""Training data: corpora, the byte-level tokenizer, the held-out split and the deterministic batch order.

Corpora (``TrainConfig.corpus``):
- ``"stdlib"``: the Python standard library's own ``*.py`` files (``sysconfig.get_paths()["stdlib"]``, without
  site-packages), concatenated in sorted relative-path order; present on every machine with Python.
- a text file, or a folder of text files (recursively, sorted by relative path; hidden entries and files that
  are not UTF-8 are skipped); tokenized as bytes (vocab 256).
- a nanoGPT token file: ``*.bin`` of uint16 token ids (read as a memmap, never loaded whole), or a folder with
  ``train.bin`` and ``val.bin``. The model's ``vocab_size`` must exceed the largest id.

Held-out split: unless the corpus comes as train.bin/val.bin, the token stream is cut into chunks of
``min(65536, n/100)`` tokens and every 50th chunk (index 49, 99, ...) is validation (2%), the rest training.
Training sequences are non-overlapping windows of ``context + 1`` tokens (inputs and shifted targets) at
stride ``context`` inside the training chunks. The run's k-th sequence is window ``perm_e[k mod W]`` with
``e = k div W`` (W windows, ``perm_e`` a permutation drawn from the data seed and the epoch e), so the data of
any step is a function of the step alone: resuming needs no sampler state, and a run longer than one pass
repeats data (the trainer warns before it starts). Validation uses fixed, evenly spaced windows of the
validation split, the same for every seed.

Every corpus has a hash: SHA-256 of its token bytes (token files over 64 MiB: of their size and 64 evenly
spaced 64 KiB blocks, marked ``sha256-sampled``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from collapse_hpo.predictors.errors import InputError

VAL_EVERY_CHUNKS = 50
MAX_CHUNK_TOKENS = 65536
_FULL_HASH_LIMIT = 64 << 20


def encode(text: str) -> np.ndarray:
    """Byte-level tokenizer: UTF-8 bytes as uint8 token ids (vocab 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def decode(tokens: np.ndarray | list[int] | torch.Tensor) -> str:
    """Inverse of `encode` (invalid UTF-8 byte sequences are replaced)."""
    arr = np.asarray(tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens, dtype=np.uint8)
    return arr.tobytes().decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Corpus:
    """A tokenized corpus with its split.

    Attributes:
        name: "stdlib" or the path given.
        tokens: the whole token stream (uint8 for bytes, uint16 memmap for token files).
        train_ranges, val_ranges: [start, end) token ranges of ``tokens`` (or of ``val_tokens_array``).
        val_tokens_array: a separate validation stream (train.bin/val.bin corpora), else None.
        sha256: corpus hash (see module docstring); hash_kind: "sha256" or "sha256-sampled".
        files: number of source files; vocab_needed: 1 + largest token id seen (256 for bytes).
    """

    name: str
    tokens: np.ndarray
    train_ranges: tuple[tuple[int, int], ...]
    val_ranges: tuple[tuple[int, int], ...]
    val_tokens_array: np.ndarray | None
    sha256: str
    hash_kind: str
    files: int
    vocab_needed: int

    @property
    def train_tokens(self) -> int:
        """Tokens in the training split."""
        return sum(e - s for s, e in self.train_ranges)

    @property
    def val_tokens(self) -> int:
        """Tokens in the validation split."""
        return sum(e - s for s, e in self.val_ranges)

    @property
    def val_stream(self) -> np.ndarray:
        return self.tokens if self.val_tokens_array is None else self.val_tokens_array


def stdlib_files() -> list[Path]:
    """The standard library's ``*.py`` files, sorted by path relative to the stdlib folder."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in root.rglob("*.py"):
        parts = f.relative_to(root).parts
        if "site-packages" in parts or "dist-packages" in parts or not f.is_file():
            continue
        out.append(f)
    return sorted(out, key=lambda f: f.relative_to(root).as_posix())


def _text_files(folder: Path) -> list[Path]:
    files = []
    for f in folder.rglob("*"):
        rel = f.relative_to(folder).parts
        if any(part.startswith(".") for part in rel) or not f.is_file():
            continue
        files.append(f)
    return sorted(files, key=lambda f: f.relative_to(folder).as_posix())


def _concat_bytes(files: list[Path], skip_non_utf8: bool) -> tuple[bytes, int]:
    pieces, used = [], 0
    for f in files:
        data = f.read_bytes()
        if skip_non_utf8:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
        pieces.append(data)
        used += 1
    return b"".join(pieces), used


def _split_ranges(
    n: int, context: int, where: str
) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    chunk = min(MAX_CHUNK_TOKENS, n // 100)
    if chunk < context + 2:
        raise InputError(
            f"corpus {where}: {n} tokens are too few for a held-out split at context {context}; "
            f"give at least {100 * (context + 2)} tokens"
        )
    train, val = [], []
    n_chunks = -(-n // chunk)
    for c in range(n_chunks):
        rng = (c * chunk, min(n, (c + 1) * chunk))
        (val if c % VAL_EVERY_CHUNKS == VAL_EVERY_CHUNKS - 1 else train).append(rng)
    if not val:  # fewer than 50 chunks: cannot happen with chunk <= n/100, kept for safety
        val.append(train.pop())
    return _merge(train), _merge(val)


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for s, e in ranges:
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return tuple(out)


def _hash_array(arr: np.ndarray) -> tuple[str, str]:
    nbytes = arr.size * arr.itemsize
    h = hashlib.sha256()
    if nbytes <= _FULL_HASH_LIMIT:
        h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest(), "sha256"
    h.update(str(nbytes).encode())
    block = (64 << 10) // arr.itemsize
    for i in range(64):
        start = (arr.size - block) * i // 63
        h.update(np.ascontiguousarray(arr[start : start + block]).tobytes())
    return h.hexdigest(), "sha256-sampled"


def _max_token(arr: np.ndarray) -> int:
    if arr.dtype == np.uint8:
        return 255
    # Sample for very large files; batches are checked again when they are drawn.
    if arr.size > (16 << 20):
        idx = np.linspace(0, arr.size - 1, 1 << 20).astype(np.int64)
        return int(arr[idx].max())
    return int(arr.max())


@functools.lru_cache(maxsize=4)
def load_corpus(corpus: str, context: int) -> Corpus:
    """Load (and cache, per process) a corpus by name or path; see the module docstring.

    Raises InputError for a missing path, an empty corpus or one too small to split at ``context``.
    """
    if corpus == "stdlib":
        files = stdlib_files()
        data, used = _concat_bytes(files, skip_non_utf8=False)
        tokens = np.frombuffer(data, dtype=np.uint8)
        name = "stdlib"
    else:
        path = Path(os.path.expanduser(corpus))
        name = str(corpus)
        if not path.exists():
            raise InputError(
                f"corpus {corpus}: no such file or folder; give 'stdlib', a text file or folder, "
                f"or a nanoGPT .bin token file"
            )
        if path.is_dir() and (path / "train.bin").is_file() and (path / "val.bin").is_file():
            train = np.memmap(path / "train.bin", dtype=np.uint16, mode="r")
            val = np.memmap(path / "val.bin", dtype=np.uint16, mode="r")
            if train.size < context + 2 or val.size < context + 2:
                raise InputError(f"corpus {corpus}: train.bin or val.bin has fewer than {context + 2} tokens")
            h_train, kind = _hash_array(train)
            h_val, _ = _hash_array(val)
            digest = hashlib.sha256((h_train + h_val).encode()).hexdigest()
            return Corpus(
                name,
                train,
                ((0, train.size),),
                ((0, val.size),),
                val,
                digest,
                kind,
                2,
                max(_max_token(train), _max_token(val)) + 1,
            )
        if path.is_file() and path.suffix == ".bin":
            tokens = np.memmap(path, dtype=np.uint16, mode="r")
            used = 1
        else:
            files = [path] if path.is_file() else _text_files(path)
            data, used = _concat_bytes(files, skip_non_utf8=path.is_dir())
            tokens = np.frombuffer(data, dtype=np.uint8)
    if tokens.size == 0:
        raise InputError(f"corpus {name}: no tokens (empty file or no UTF-8 text files)")
    train_ranges, val_ranges = _split_ranges(int(tokens.size), context, name)
    digest, kind = _hash_array(tokens)
    return Corpus(name, tokens, train_ranges, val_ranges, None, digest, kind, used, _max_token(tokens) + 1)


class Windows:
    """Non-overlapping windows of ``context + 1`` tokens at stride ``context`` inside token ranges."""

    def __init__(self, stream: np.ndarray, ranges: tuple[tuple[int, int], ...], context: int) -> None:
        self.stream, self.context = stream, context
        starts = np.array([s for s, _ in ranges], dtype=np.int64)
        counts = np.array([max(0, (e - s - 1) // context) for s, e in ranges], dtype=np.int64)
        self.range_starts = starts
        self.cum = np.concatenate([[0], np.cumsum(counts)])
        self.count = int(self.cum[-1])

    def offsets(self, window: np.ndarray) -> np.ndarray:
        """Start offsets in the stream of the given window indices."""
        r = np.searchsorted(self.cum, window, side="right") - 1
        return self.range_starts[r] + (window - self.cum[r]) * self.context

    def gather(self, window: np.ndarray) -> np.ndarray:
        """Token windows [n, context + 1] (int64)."""
        idx = self.offsets(window)[:, None] + np.arange(self.context + 1, dtype=np.int64)[None, :]
        return np.asarray(self.stream[idx], dtype=np.int64)


class TrainBatches:
    """The run's sequence order: sequence k → window ``perm_{k div W}[k mod W]``; see the module docstring."""

    def __init__(self, corpus: Corpus, context: int, vocab_size: int, data_seed: int) -> None:
        self.corpus, self.context, self.vocab_size, self.seed = corpus, context, vocab_size, data_seed
        self.windows = Windows(corpus.tokens, corpus.train_ranges, context)
        if self.windows.count == 0:
            raise InputError(f"corpus {corpus.name}: no training window of {context + 1} tokens")
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    @property
    def tokens_per_pass(self) -> int:
        """Target tokens in one pass over the training windows."""
        return self.windows.count * self.context

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = rng.permutation(self.windows.count)
            self._epoch = epoch
        return self._perm

    def get(self, first_sequence: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets [n, context] of sequences first_sequence .. first_sequence + n − 1."""
        k = np.arange(first_sequence, first_sequence + n, dtype=np.int64)
        w = self.windows.count
        epochs = k // w
        window = np.empty(n, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            window[sel] = self._permutation(int(e))[k[sel] % w]
        seq = self.windows.gather(window)
        if self.corpus.tokens.dtype != np.uint8 and int(seq.max()) >= self.vocab_size:
            raise InputError(
                f"corpus {self.corpus.name}: token id {int(seq.max())} >= vocab_size "
                f"{self.vocab_size}; set vocab_size above the corpus's largest id"
            )
        t = torch.from_numpy(seq)
        return t[:, :-1], t[:, 1:]


def validation_windows(corpus: Corpus, context: int, val_tokens: int) -> torch.Tensor:
    """Fixed validation sequences [n, context + 1]: n = val_tokens/context windows, evenly spaced over the
    validation split (all of them when it has fewer)."""
    windows = Windows(corpus.val_stream, corpus.val_ranges, context)
    if windows.count == 0:
        raise InputError(f"corpus {corpus.name}: validation split has no window of {context + 1} tokens")
    n = max(1, min(windows.count, val_tokens // context))
    pick = np.unique(np.linspace(0, windows.count - 1, n).round().astype(np.int64))
    return torch.from_numpy(windows.gather(pick))
