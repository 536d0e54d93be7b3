"""examples/paper/frequency.py (Fig. 4): per-token log-probabilities against the training
log-unigram, full model and bias dropped, in equal-width bins."""

import argparse
import datetime
import math
import shutil
from collections import Counter

import frequency
import frequency as frequency_cli
import numpy as np
import pytest
import torch
from natbias_testing import NO_LOADER_PROCESS, console_script_help, fairseq, train

from natbias.errors import NaturalBiasError

LN2 = math.log(2.0)


def one_after_another(function, arguments):
    """fairseq runs in this process (natbias_testing.fairseq): one at a time,
    as they share fairseq's global state."""
    return [function(argument) for argument in arguments]


@pytest.fixture(scope="session")
def checkpoints(toy_bin, tmp_path_factory):
    """Tiny models trained a few updates: a frozen log-unigram bias (b stays
    the smoothed log-unigram exactly) and a zero-initialised bias; and the
    zero model saved as fairseq saves a --natbias-init none model (no bias
    entry, natbias_init none in its config)."""
    root = tmp_path_factory.mktemp("frequency_models")
    inits = {"unigram": ["--natbias-freeze"], "zero": []}
    one_after_another(
        lambda init: train(
            toy_bin, root / init, "--natbias-init", init, *inits[init], max_update=4
        ),
        inits,
    )
    found = {init: root / init / "checkpoint_last.pt" for init in inits}
    state = torch.load(found["zero"], map_location="cpu")
    del state["model"]["decoder.output_projection.bias"]
    state["cfg"]["model"].natbias_init = "none"
    found["none"] = root / "none.pt"
    torch.save(state, found["none"])
    return found


@pytest.fixture(scope="session")
def known_probabilities_checkpoint(checkpoints, tmp_path_factory):
    """The frozen-unigram model with W = 0: its logits are b = log p_unigram
    for every context, so p_theta is the unigram and W phi is uniform."""
    path = tmp_path_factory.mktemp("known") / "w0.pt"
    state = torch.load(checkpoints["unigram"], map_location="cpu")
    state["model"]["decoder.output_projection.weight"].zero_()
    torch.save(state, path)
    return path


def _test_token_counts(toy_text, dictionary):
    """Reference-token counts straight from the text: each word, then EOS."""
    counts = Counter()
    for line in (toy_text / "test.tgt").read_text().splitlines():
        counts.update(dictionary.index(word) for word in line.split())
        counts[dictionary.eos()] += 1
    return counts


def _train_log_unigram(toy_text, dictionary):
    """Add-one smoothed log-unigram of the training targets, EOS included."""
    counts = np.zeros(len(dictionary))
    for line in (toy_text / "train.tgt").read_text().splitlines():
        for word in line.split():
            counts[dictionary.index(word)] += 1
        counts[dictionary.eos()] += 1
    return np.log((counts + 1) / (counts.sum() + len(dictionary)))


def _brute_force_bins(x, ys, n_bins):
    """Equal-width bins by floor((x - low) / width), the top edge in the last bin."""
    low, high = x.min(), x.max()
    width = (high - low) / n_bins
    members = {}
    for i, value in enumerate(x):
        members.setdefault(min(int((value - low) / width), n_bins - 1), []).append(i)
    return {b: [float(np.mean(y[idx])) for y in (x, *ys)] for b, idx in sorted(members.items())}


@pytest.mark.training
def test_bins_and_averages_of_a_model_with_known_probabilities(
    known_probabilities_checkpoint, toy_bin, toy_text
):
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    scores = frequency.score_checkpoint("w0", str(known_probabilities_checkpoint), str(toy_bin))
    expected_counts = _test_token_counts(toy_text, dictionary)
    assert {i: int(n) for i, n in enumerate(scores.occurrences) if n} == dict(expected_counts)
    log_u = _train_log_unigram(toy_text, dictionary)
    np.testing.assert_allclose(scores.log_unigram, log_u, atol=1e-5)

    x, full, without = scores.averages()
    np.testing.assert_allclose(full, x, atol=1e-5)  # p_theta = unigram: y = x
    np.testing.assert_allclose(without, -math.log(len(dictionary)), atol=1e-5)  # uniform

    n_bins = 4
    rows = frequency.bin_averages(scores, frequency.equal_width_edges([x], n_bins))
    expected = _brute_force_bins(x, (full, without), n_bins)
    assert [r["bin"] for r in rows] == list(expected)
    for row in rows:
        mean_x, mean_full, mean_without = expected[row["bin"]]
        assert row["mean_log_unigram"] == pytest.approx(mean_x)
        assert row["mean_logprob_full"] == pytest.approx(mean_full)
        assert row["mean_logprob_without_bias"] == pytest.approx(mean_without)
    assert sum(r["token_types"] for r in rows) == len(expected_counts)
    assert sum(r["occurrences"] for r in rows) == sum(expected_counts.values())


def _score_reference(checkpoint, data, *overrides):
    """Per-type mean log-probability of the reference tokens as fairseq's own
    SequenceScorer (fairseq-generate --score-reference) computes it."""
    result = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        data,
        "--path",
        checkpoint,
        "--user-dir",
        "fairseq_natbias",
        "--score-reference",
        "--batch-size",
        "8",
        "--required-batch-size-multiple",
        "1",
        *overrides,
    )
    hypotheses, scores = {}, {}
    for line in result.stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind.startswith("H-"):
            hypotheses[kind[2:]] = rest.split("\t")[1].split()
        elif kind.startswith("P-"):
            scores[kind[2:]] = [float(v) * LN2 for v in rest.split()]  # printed in base 2
    sums, counts = Counter(), Counter()
    for sid, words in hypotheses.items():
        for word, score in zip(words + ["</s>"], scores[sid]):
            sums[word] += score
            counts[word] += 1
    return {word: sums[word] / counts[word] for word in counts}


@pytest.mark.training
def test_scores_match_fairseq_score_reference_with_and_without_bias(checkpoints, toy_bin):
    scores = frequency.score_checkpoint("unigram", str(checkpoints["unigram"]), str(toy_bin))
    present = np.flatnonzero(scores.present)
    ours_full = {scores.symbols[t]: scores.sum_full[t] / scores.occurrences[t] for t in present}
    ours_without = {
        scores.symbols[t]: scores.sum_without_bias[t] / scores.occurrences[t] for t in present
    }
    # lambda = 0 through fairseq's --model-overrides: logits W phi only
    fairseq_full, fairseq_without = one_after_another(
        lambda overrides: _score_reference(checkpoints["unigram"], toy_bin, *overrides),
        [(), ("--model-overrides", "{'natbias_bias_scale': 0.0}")],
    )
    assert set(fairseq_full) == set(ours_full)
    for word in ours_full:
        assert ours_full[word] == pytest.approx(fairseq_full[word], abs=2e-4)
        assert ours_without[word] == pytest.approx(fairseq_without[word], abs=2e-4)
    assert max(abs(ours_full[w] - ours_without[w]) for w in ours_full) > 0.1


@pytest.mark.training
def test_four_panels_and_csv_for_a_zero_and_a_unigram_model(checkpoints, toy_bin, tmp_path, capsys):
    out = tmp_path / "fig4"
    frequency_cli.main(
        [
            str(toy_bin),
            "--model",
            f"zero={checkpoints['zero']}",
            "--model",
            str(checkpoints["unigram"]),
            "--bins",
            "6",
            "--out-dir",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert "unigram: 20 sentences" in printed  # the default label is the model's init
    assert (out / "frequency.png").stat().st_size > 20_000
    rows = (out / "frequency_bins.csv").read_text().splitlines()
    assert rows[0].startswith("model,bin,bin_low,bin_high")
    models = Counter(row.split(",")[0] for row in rows[1:])
    assert set(models) == {"zero", "unigram"} and all(1 <= n <= 6 for n in models.values())
    types_in_bins = sum(int(row.split(",")[5]) for row in rows[1:])
    tokens = (out / "frequency_tokens.csv").read_text().splitlines()
    assert len(tokens) - 1 == types_in_bins  # one row per model and token type


@pytest.mark.training
def test_model_without_bias_says_both_rows_are_the_same(checkpoints, toy_bin, tmp_path, capsys):
    frequency_cli.main(
        [str(toy_bin), "--model", str(checkpoints["none"]), "--out-dir", str(tmp_path / "none")]
    )
    assert (
        "has no output bias, so the bias-dropped row equals the full model"
        in capsys.readouterr().out
    )
    scores = frequency.score_checkpoint("none", str(checkpoints["none"]), str(toy_bin))
    assert not scores.has_bias
    np.testing.assert_array_equal(scores.sum_full, scores.sum_without_bias)


def _empty_split(data_dir, split="test"):
    from fairseq.data import indexed_dataset

    for side in ("src", "tgt"):
        prefix = data_dir / f"{split}.src-tgt.{side}"
        builder = indexed_dataset.MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
        builder.finalize(f"{prefix}.idx")


@pytest.mark.training
def test_bad_inputs_end_with_a_clear_message(checkpoints, toy_bin, fresh_copy, tmp_path):
    unused = str(tmp_path / "unused")  # never written: each call is refused first
    data = fresh_copy(toy_bin)
    with open(data / "dict.tgt.txt", "a") as extra:
        extra.writelines(f"extra{i} 1\n" for i in range(8))
    with pytest.raises(SystemExit, match="mismatched dictionaries: .* target dictionary of 40"):
        frequency_cli.main([str(data), "--model", str(checkpoints["zero"]), "--out-dir", unused])
    shutil.copy(toy_bin / "dict.tgt.txt", data / "dict.tgt.txt")
    _empty_split(data)
    with pytest.raises(NaturalBiasError, match="test split of .* is empty"):
        frequency.score_checkpoint("zero", str(checkpoints["zero"]), str(data))
    with pytest.raises(SystemExit, match="examples/paper/frequency.py: error: .*valid2"):
        frequency_cli.main(
            [
                str(toy_bin),
                "--model",
                str(checkpoints["zero"]),
                "--gen-subset",
                "valid2",
                "--out-dir",
                unused,
            ]
        )
    # A dictionary given for a checkpoint: a bare IndexError from torch's
    # unpickler in 0.7.0.
    with pytest.raises(
        SystemExit,
        match=r"examples/paper/frequency.py: error: .*dict.tgt.txt is not a "
        r"fairseq checkpoint \(not a torch.save archive\)",
    ):
        frequency_cli.main(
            [str(toy_bin), "--model", str(toy_bin / "dict.tgt.txt"), "--out-dir", unused]
        )


@pytest.mark.training
def test_user_dir_of_this_package_is_taken_as_loaded(checkpoints, toy_bin, tmp_path):
    """fairseq's habit, --user-dir fairseq_natbias, from a second copy of the
    package (an installed one beside a checkout): fairseq alone refuses it as
    not globally unique; the tool points it at the copy it has loaded, as
    natbias-step0 does. A plugin that does not import ends with the tool's
    message, not a traceback."""
    from fairseq import utils

    other_copy = tmp_path / "copy" / "fairseq_natbias"
    other_copy.mkdir(parents=True)
    (other_copy / "__init__.py").write_text("")
    with pytest.raises(ImportError, match="not globally unique"):
        utils.import_user_module(argparse.Namespace(user_dir=str(other_copy)))
    frequency_cli.main(
        [
            str(toy_bin),
            "--model",
            str(checkpoints["zero"]),
            "--user-dir",
            str(other_copy),
            "--out-dir",
            str(tmp_path / "out"),
        ]
    )
    assert (tmp_path / "out" / "frequency_tokens.csv").exists()
    broken = tmp_path / "broken_plugin"
    broken.mkdir()
    (broken / "__init__.py").write_text("import a_module_nobody_has\n")
    with pytest.raises(
        SystemExit, match="examples/paper/frequency.py: error: --user-dir .*broken_plugin"
    ):
        frequency_cli.main(
            [
                str(toy_bin),
                "--model",
                str(checkpoints["zero"]),
                "--user-dir",
                str(broken),
                "--out-dir",
                str(tmp_path / "unused"),
            ]
        )


@pytest.mark.training
def test_checkpoint_with_unknown_pickled_types_gets_a_hint(checkpoints, toy_bin, tmp_path):
    """numpy arrays (what fairseq-train --eval-bleu leaves in the metrics state)
    load under torch's weights-only loading; a type nobody allow-listed is
    refused with a hint instead of a traceback."""
    state = torch.load(checkpoints["zero"], map_location="cpu")
    state["extra_state"]["bleu_counts"] = np.zeros(4, dtype=np.int64)
    torch.save(state, tmp_path / "with_numpy.pt")
    frequency_cli.main(
        [
            str(toy_bin),
            "--model",
            str(tmp_path / "with_numpy.pt"),
            "--out-dir",
            str(tmp_path / "numpy_out"),
        ]
    )
    assert (tmp_path / "numpy_out/frequency_bins.csv").exists()

    state["extra_state"]["when"] = datetime.date(2023, 7, 9)
    torch.save(state, tmp_path / "with_date.pt")
    with pytest.raises(
        SystemExit, match="weights-only loading refused.*TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    ):
        frequency_cli.main(
            [
                str(toy_bin),
                "--model",
                str(tmp_path / "with_date.pt"),
                "--out-dir",
                str(tmp_path / "out"),
            ]
        )


def test_console_script_help():
    """The installed script runs this package's main; --help describes the tool."""
    assert "four panels of Fig. 4" in console_script_help("examples/paper/frequency.py")
