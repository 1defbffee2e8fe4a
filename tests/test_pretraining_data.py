"""The pretraining data pipeline: d2l's rules, checked with statistics over many draws."""

import random

import numpy as np
import pytest

from bert_multi import CONFIGS, InputError
from bert_multi.training import (
    RESERVED_TOKENS,
    PretrainingData,
    Vocab,
    builtin_corpus,
    check_batch,
    mlm_example,
    nsp_examples,
    num_mlm_predictions,
    paragraphs_from_lines,
    read_wiki,
    replace_mlm_tokens,
    tokenize,
)


@pytest.fixture(scope="module")
def data():
    return PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus()), max_len=64, seed=0)


def test_vocab_is_d2l_1_0s():
    vocab = Vocab([["b", "a", "b"], ["c", "b", "a"]], min_freq=2, reserved_tokens=["<pad>"])
    assert vocab.idx_to_token == ["<pad>", "<unk>", "a", "b"]  # sorted; 'c' is too rare
    assert vocab["b"] == 3 and vocab["c"] == vocab.unk == 1 and vocab[["a", "zzz"]] == [2, 1]
    assert vocab.to_tokens([3, 2]) == ["b", "a"] and len(vocab) == 4
    assert tokenize(["ab cd"]) == [["ab", "cd"]] and tokenize(["ab"], "char") == [["a", "b"]]


def test_wiki_reader_lower_cases_splits_and_skips_single_sentences(tmp_path):
    (tmp_path / "wiki.txt").write_text("The Cat sat . It Slept .\nA lone heading\n\n One . Two . Three .\n")
    assert read_wiki(tmp_path / "wiki.txt") == [["the cat sat", "it slept ."], ["one", "two", "three ."]]


def test_builtin_corpus_is_deterministic_and_wikitext_shaped():
    assert builtin_corpus(seed=3) == builtin_corpus(seed=3) != builtin_corpus(seed=4)
    paragraphs = paragraphs_from_lines(builtin_corpus())
    assert len(paragraphs) == 800 and all(len(p) >= 3 for p in paragraphs)


def test_mlm_replacements_are_80_10_10_and_draw_from_the_whole_vocabulary():
    vocab = Vocab([[f"w{i}" for i in range(200)]], reserved_tokens=RESERVED_TOKENS)
    rng = random.Random(0)
    tokens = ["<cls>", *[f"w{i}" for i in range(40)], "<sep>"]
    counts = {"mask": 0, "kept": 0, "random": 0}
    drawn = []
    for _ in range(2000):
        mlm_input, predictions = replace_mlm_tokens(tokens, list(range(1, 41)), 10, vocab, rng)
        for position, label in predictions:
            if mlm_input[position] == "<mask>":
                counts["mask"] += 1
            elif mlm_input[position] == label:
                counts["kept"] += 1  # also the rare random draw of the same token
            else:
                counts["random"] += 1
                drawn.append(mlm_input[position])
    n = sum(counts.values())
    assert n == 20000
    for outcome, share in (("mask", 0.8), ("kept", 0.1), ("random", 0.1)):
        bound = 5 * (share * (1 - share) / n) ** 0.5  # five standard deviations
        assert abs(counts[outcome] / n - share) < bound, (outcome, counts)
    # d2l <= 0.17.0 drew an *index* here, which then read as '<unk>': the draws must cover the vocabulary.
    assert drawn.count("<unk>") < 0.05 * len(drawn)
    assert len(set(drawn)) > 0.9 * len(vocab)


def test_every_example_follows_the_rules(data):
    arrays, vocab = data.arrays, data.vocab
    slots = round(64 * 0.15)
    assert arrays["pred_positions"].shape == (len(data), slots)
    special = {vocab["<cls>"], vocab["<sep>"]}
    for i in range(len(data)):
        n = int(arrays["valid_lens"][i])
        real = arrays["mlm_weights"][i] == 1
        assert real.sum() == num_mlm_predictions(n) == max(1, round(0.15 * n))
        assert np.all(arrays["mlm_weights"][i][~real] == 0)
        positions = arrays["pred_positions"][i][real]
        assert np.all(np.diff(positions) > 0) and positions.max() < n  # sorted, distinct, inside the sequence
        assert not set(arrays["mlm_labels"][i][real]) & special  # <cls>/<sep> are never predicted
        assert np.all(arrays["pred_positions"][i][~real] == 0) and np.all(arrays["mlm_labels"][i][~real] == 0)
        assert arrays["tokens"][i][0] == vocab["<cls>"] and np.all(arrays["tokens"][i][n:] == vocab["<pad>"])
        assert np.all(arrays["segments"][i][n:] == 0)


def test_nsp_labels_are_about_half_true(data):
    share = data.arrays["nsp_labels"].mean()
    assert abs(share - 0.5) < 5 * (0.25 / len(data)) ** 0.5


def test_pairs_too_long_for_max_len_are_dropped_not_truncated():
    rng = random.Random(0)
    long_paragraph = [["a"] * 8, ["b"] * 8, ["c"] * 8]  # every pair needs 19 tokens
    assert nsp_examples(long_paragraph, [long_paragraph], max_len=10, rng=rng) == []
    short_paragraph = [["x"] * 2, ["y"] * 3, ["z"] * 2]  # every pair fits in 10
    examples = nsp_examples(short_paragraph, [short_paragraph], max_len=10, rng=rng)
    assert len(examples) == 2
    for tokens, segments, _ in examples:  # kept whole: <cls> a <sep> b <sep>
        assert tokens[0] == "<cls>" and tokens.count("<sep>") == 2 and len(tokens) == len(segments) <= 10
    with pytest.raises(InputError, match="no sentence pair that fits in max_len=4"):
        PretrainingData.from_paragraphs([["x y z", "u v w"]], max_len=4)


def test_the_same_seed_gives_the_same_batches():
    paragraphs = paragraphs_from_lines(builtin_corpus(100))
    first = PretrainingData.from_paragraphs(paragraphs, max_len=32, seed=5)
    second = PretrainingData.from_paragraphs(paragraphs, max_len=32, seed=5)
    other = PretrainingData.from_paragraphs(paragraphs, max_len=32, seed=6)
    a, b, c = next(first.batches(8, seed=1)), next(second.batches(8, seed=1)), next(other.batches(8, seed=1))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["tokens"], c["tokens"])
    random.seed(123)  # the global state plays no part
    assert np.array_equal(next(PretrainingData.from_paragraphs(paragraphs, 32, 5).batches(8, 1))["tokens"], a["tokens"])


def test_an_epoch_is_a_permutation_of_the_examples():
    small = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(20)), max_len=32)
    epoch = next(small.batches(len(small), seed=2))["tokens"]
    assert not np.array_equal(epoch, small.arrays["tokens"])  # shuffled
    assert np.array_equal(np.unique(epoch, axis=0), np.unique(small.arrays["tokens"], axis=0))
    in_order = next(small.batches(5, shuffle=False))["tokens"]
    assert np.array_equal(in_order, small.arrays["tokens"][:5])
    with pytest.raises(ValueError, match="batch_size 0 must be in"):
        next(small.batches(0))


def test_mlm_example_maps_tokens_through_the_vocabulary():
    vocab = Vocab([["x", "y"]], reserved_tokens=RESERVED_TOKENS)
    ids, positions, labels = mlm_example(["<cls>", "x", "y", "<sep>"], vocab, random.Random(0))
    assert positions == [positions[0]] and positions[0] in (1, 2)  # round(0.6) = 1 prediction
    assert labels == [vocab[["<cls>", "x", "y", "<sep>"][positions[0]]]]
    assert len(ids) == 4


def test_check_batch_rejects_bad_labels(data):
    config = CONFIGS["tiny"].__class__(len(data.vocab), 12, 20, 3, 2, max_len=64)
    batch = next(data.batches(4))
    assert check_batch(config, batch)["mlm_labels"].dtype == np.int64
    with pytest.raises(InputError, match="mlm_labels must be token ids"):
        check_batch(config, {**batch, "mlm_labels": batch["mlm_labels"] + len(data.vocab)})
    with pytest.raises(InputError, match="nsp_labels must be 0 or 1"):
        check_batch(config, {**batch, "nsp_labels": batch["nsp_labels"] + 2})
    with pytest.raises(InputError, match="mlm_weights has shape"):
        check_batch(config, {**batch, "mlm_weights": batch["mlm_weights"][:, :2]})
    with pytest.raises(InputError, match="missing"):
        check_batch(config, {k: v for k, v in batch.items() if k != "nsp_labels"})
    for optional in ("valid_lens", "pred_positions"):  # optional for a forward, required to train
        with pytest.raises(InputError, match="a pretraining batch needs valid_lens and pred_positions"):
            check_batch(config, {**batch, optional: None})


def test_a_true_next_label_means_the_second_sentence_follows_the_first():
    """Every sentence of this corpus is unique, so each pair can be traced back to the corpus: label 1
    must mean the true next sentence, label 0 a sentence drawn from anywhere (rarely the true one)."""
    paragraphs = [[f"p{p}s{s} word{s} word{p}" for s in range(4)] for p in range(60)]
    successor = {a: b for paragraph in paragraphs for a, b in zip(paragraph, paragraph[1:])}
    data = PretrainingData.from_paragraphs(paragraphs, max_len=16, seed=3, min_freq=1)
    arrays, vocab = data.arrays, data.vocab
    coincidences = 0
    for i in range(len(data)):
        tokens = arrays["tokens"][i].copy()
        real = arrays["mlm_weights"][i] == 1
        tokens[arrays["pred_positions"][i][real]] = arrays["mlm_labels"][i][real]  # undo the masking
        words = vocab.to_tokens(tokens[: int(arrays["valid_lens"][i])])
        split = words.index("<sep>")
        first, second = " ".join(words[1:split]), " ".join(words[split + 1 : -1])
        if arrays["nsp_labels"][i] == 1:
            assert successor.get(first) == second, (first, second)
        else:
            coincidences += successor.get(first) == second  # a random draw may hit the true one
    assert len(data) == 180 and coincidences < 0.1 * (arrays["nsp_labels"] == 0).sum()
