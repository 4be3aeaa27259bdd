"""Corpora, the byte tokenizer, the held-out split and the deterministic batch order (trainers/data.py)."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.trainers.config import TrainConfig
from collapse_hpo.trainers.data import (
    TrainBatches,
    decode,
    encode,
    load_corpus,
    stdlib_files,
    validation_windows,
)
from collapse_hpo.trainers.train import train


def test_byte_tokenizer_round_trips_unicode():
    text = "def f(x):\n    return 'τ ≈ 0.2'  # ü\n"
    tokens = encode(text)
    assert tokens.dtype == np.uint8 and tokens.max() < 256
    assert len(tokens) == len(text.encode("utf-8"))
    assert decode(tokens) == text


def test_stdlib_corpus_is_sorted_hashed_and_split_without_overlap():
    files = stdlib_files()
    assert len(files) > 100 and all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    corpus = load_corpus("stdlib", 128)
    assert corpus.tokens.size == sum(f.stat().st_size for f in files)
    assert len(corpus.sha256) == 64 and corpus.hash_kind == "sha256"
    covered = sorted(corpus.train_ranges + corpus.val_ranges)
    assert covered[0][0] == 0 and covered[-1][1] == corpus.tokens.size
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(covered))  # disjoint
    assert corpus.train_tokens + corpus.val_tokens == corpus.tokens.size
    assert 0.015 < corpus.val_tokens / corpus.tokens.size < 0.03


def test_text_folder_and_token_file_corpora(tmp_path):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("b" * 30_000)
    (folder / "sub" / "a.txt").write_text("a" * 30_000)
    (folder / ".hidden").write_text("h" * 1000)
    (folder / "binary.dat").write_bytes(b"\xff\xfe\x00" * 100)
    corpus = load_corpus(str(folder), 32)
    assert corpus.files == 2  # hidden and non-UTF-8 files skipped
    assert decode(corpus.tokens[:3]) == "bbb"  # sorted by relative path: b.txt before sub/a.txt
    ids = (np.arange(50_000) % 1000).astype(np.uint16)
    ids.tofile(tmp_path / "tokens.bin")
    tok = load_corpus(str(tmp_path / "tokens.bin"), 32)
    assert tok.vocab_needed == 1000 and tok.tokens.dtype == np.uint16
    batches = TrainBatches(tok, 32, 1000, data_seed=0)
    x, y = batches.get(0, 4)
    assert x.shape == (4, 32) and np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())
    assert np.all((y.numpy() - x.numpy()) % 1000 == 1)  # consecutive ids: targets are inputs shifted by one
    with pytest.raises(InputError, match="vocab_size"):
        train(
            TrainConfig(
                width=16,
                depth=1,
                heads=2,
                context=32,
                corpus=str(tmp_path / "tokens.bin"),
                total_tokens=512,
                batch_tokens=256,
            )
        )
    with pytest.raises(InputError, match="no such file"):
        load_corpus(str(tmp_path / "missing"), 32)


def test_batches_are_deterministic_and_one_pass_visits_every_window_once(tmp_path):
    path = tmp_path / "c.txt"
    rng = np.random.default_rng(0)
    path.write_text(
        "".join(chr(c) for c in rng.integers(97, 123, 60_000))
    )  # random letters: distinct windows
    corpus = load_corpus(str(path), 16)
    a = TrainBatches(corpus, 16, 256, data_seed=3)
    b = TrainBatches(corpus, 16, 256, data_seed=3)
    c = TrainBatches(corpus, 16, 256, data_seed=4)
    w = a.windows.count
    xa, _ = a.get(0, w)
    assert np.array_equal(xa.numpy(), b.get(0, w)[0].numpy())
    assert not np.array_equal(xa.numpy(), c.get(0, w)[0].numpy())
    assert len({tuple(row) for row in xa.numpy()}) == w  # one pass: every window exactly once
    assert np.array_equal(np.sort(a.windows.offsets(a._permutation(0))), a.windows.offsets(np.arange(w)))
    # Any slice is the same as the corresponding part of a bigger request (resume needs no sampler state).
    assert np.array_equal(a.get(w - 3, 6)[0].numpy(), b.get(0, w + 3)[0].numpy()[w - 3 :])
    # Validation windows come from the held-out ranges only.
    val = validation_windows(corpus, 16, 10_000).numpy()
    val_text = {bytes(row.astype(np.uint8)) for row in val}
    train_text = {bytes(row.astype(np.uint8)) for row in a.windows.gather(np.arange(w))}
    assert val.shape[1] == 17 and not val_text & train_text


def test_a_run_that_repeats_data_says_so_before_it_starts(tmp_path, caplog):
    path = tmp_path / "small.txt"
    path.write_text("abcdefghij" * 2000)  # 20,000 bytes: about 19,600 training tokens
    config = TrainConfig(
        width=16,
        depth=1,
        heads=2,
        context=16,
        corpus=str(path),
        total_tokens=40_960,
        batch_tokens=1024,
        report_every_tokens=40_960,
        val_tokens=256,
        threads=1,
    )
    seen = []
    with caplog.at_level(logging.WARNING, logger="collapse_hpo.trainers"):
        result = train(config, reporter=lambda r: seen.append((len(caplog.records), r)))
    warnings = [r.getMessage() for r in caplog.records if "repeats data" in r.getMessage()]
    assert len(warnings) == 1 and seen[0][0] >= 1  # logged before the first report
    assert result.metadata["warnings"] and "repeats data" in result.metadata["warnings"][0]
    clean = train(
        TrainConfig(
            width=16,
            depth=1,
            heads=2,
            context=16,
            corpus=str(path),
            total_tokens=4096,
            batch_tokens=1024,
            val_tokens=256,
            threads=1,
        )
    )
    assert clean.metadata["warnings"] == []
