"""natbias.tools.by_frequency and natbias.tools.frequency_bias: the statistics of
natbias-loss-by-frequency, -frequency-bias and -output-frequency, each number
against a hand computation; natbias-output-frequency end to end (text only)."""

import csv
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from natbias_testing import REPO, fairseq, top_level_imports

from natbias.errors import NaturalBiasError
from natbias.tools import by_frequency, frequency_bias
from natbias.tools.frequency_bias import Pair


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# --- bins -------------------------------------------------------------------------


def test_bins_are_lower_bounds_and_bad_edge_lists_are_refused():
    assert by_frequency.bin_labels([0, 1, 51, 101]) == ["0", "1-50", "51-100", ">=101"]
    edges = by_frequency.check_edges([1, 51, 101])
    assert by_frequency.bin_of([0, 1, 50, 51, 100, 101, 10**6], edges).tolist() == [
        -1, 0, 0, 1, 1, 2, 2,
    ]  # fmt: skip
    with pytest.raises(NaturalBiasError, match="bin edges out of order: 1 101 51"):
        by_frequency.check_edges([1, 101, 51])
    with pytest.raises(NaturalBiasError, match="out of order"):
        by_frequency.check_edges([1, 1])
    with pytest.raises(NaturalBiasError, match="an empty bin set"):
        by_frequency.check_edges([])
    with pytest.raises(NaturalBiasError, match="counts >= 0"):
        by_frequency.check_edges([-1, 5])


def test_loss_difference_per_bin_by_hand():
    # types 0..4 counted 0, 3, 7, 60, 200 times in training; bins 1-9, 10-99, >=100
    counts = np.array([0, 3, 7, 60, 200])
    ids = np.array([1, 2, 1, 3, 4, 4, 0, 2])
    base = np.array([4.0, 2.0, 6.0, 1.0, 0.5, 0.7, 9.0, 3.0])
    model = np.array([3.0, 2.5, 2.0, 1.5, 0.5, 0.4, 1.0, 1.0])
    rows = by_frequency.loss_difference_bins(ids, base, model, counts, [1, 10, 100], min_tokens=2)
    # bin 1-9: tokens 0, 1, 2, 7 (types 1, 2): differences -1, +0.5, -4, -2
    assert rows[0]["bin"] == "1-9" and rows[0]["tokens"] == 4 and rows[0]["types"] == 2
    assert rows[0]["median_difference_bits"] == pytest.approx(-1.5)  # (-2 + -1) / 2
    assert rows[0]["mean_difference_bits"] == pytest.approx(-6.5 / 4)
    assert rows[0]["mean_loss_baseline_bits"] == pytest.approx(15 / 4)
    assert rows[0]["few"] is False
    # bin 10-99: token 3 alone: +0.5, fewer than min_tokens
    assert (rows[1]["tokens"], rows[1]["few"]) == (1, True)
    assert rows[1]["median_difference_bits"] == pytest.approx(0.5)
    # bin >=100: tokens 4, 5: 0 and -0.3
    assert rows[2]["median_difference_bits"] == pytest.approx(-0.15)
    assert rows[2]["mean_loss_model_bits"] == pytest.approx(0.45)
    assert sum(r["tokens"] for r in rows) == 7  # the unseen type 0 is below the first edge


def test_a_bin_set_no_token_falls_in_is_refused():
    with pytest.raises(NaturalBiasError, match="every bin is empty"):
        by_frequency.loss_difference_bins([0, 1], [1.0, 1.0], [1.0, 1.0], [3, 4], [10, 20])


def test_output_frequency_and_kl_by_hand():
    rows = by_frequency.output_frequency_bins(
        produced=np.array([5, 0, 2, 3]),
        reference=np.array([2, 4, 2, 0]),
        train_counts=np.array([100, 1, 2, 150]),
        edges=[1, 10],
        min_tokens=3,
    )
    assert [(r["produced"], r["reference"]) for r in rows] == [(2, 6), (8, 2)]
    assert rows[0]["ratio"] == pytest.approx(1 / 3) and rows[1]["ratio"] == pytest.approx(4.0)
    assert [r["few"] for r in rows] == [False, True]
    # KL([.5, .5] || [.25, .75]) = .5 log2 2 + .5 log2(2/3)
    assert by_frequency.kl_bits([0.5, 0.5], [0.25, 0.75]) == pytest.approx(
        0.5 + 0.5 * math.log2(2 / 3)
    )
    assert by_frequency.kl_bits([1, 1], [3, 3]) == pytest.approx(0.0)
    np.testing.assert_allclose(by_frequency.smoothed_unigram([0, 2]), [1 / 4, 3 / 4])


# --- BLiMP frequency bias ------------------------------------------------------------


def test_differing_tokens_and_app_e_filter():
    assert frequency_bias.differing_tokens([5, 6, 7], [5, 8, 7]) == ([6], [8], "replacement")
    # a piece both words share is no difference; multiplicity counts
    assert frequency_bias.differing_tokens([1, 2, 2, 3], [1, 2, 4, 4]) == (
        [2, 3],
        [4, 4],
        "replacement",
    )
    assert frequency_bias.differing_tokens([1, 2, 3], [3, 1, 2])[2] == "reordered"
    assert frequency_bias.differing_tokens([1, 2, 3], [1, 2, 9, 3])[2] == "added"
    assert frequency_bias.relative_difference(30, 10) == pytest.approx(0.5)
    assert frequency_bias.relative_difference(0, 0) == 0.0


def test_frequency_bias_by_hand():
    """Seven pairs, one skipped (added); the six kept rank into thirds of two."""
    counts = np.array([0, 10, 20, 30, 40, 2, 90, 5])
    tokens = [
        ([1, 2], [1, 4]),  # f 20 vs 40: -1/3
        ([1, 6], [1, 5]),  # 90 vs 2: +88/92
        ([3], [1]),  # 30 vs 10: +0.5
        ([5, 7], [6, 1]),  # (2 + 5) / 2 = 3.5 vs (90 + 10) / 2 = 50: -46.5/53.5
        ([1], [1, 2]),  # added: skipped
        ([2], [3]),  # 20 vs 30: -0.2
        ([4], [2]),  # 40 vs 20: +1/3
    ]
    scores = [
        (-1.0, -2.0),
        (-1.0, -3.0),
        (-5.0, -4.0),
        (-2.0, -1.0),
        (0.0, 0.0),
        (-1.0, -1.0),
        (-3.0, -2.0),
    ]
    pairs = [Pair(i + 1, f"g{i}", f"b{i}") for i in range(len(tokens))]
    result = frequency_bias.frequency_bias(pairs, tokens, counts, scores)
    # rank by relative difference: pair 4 (-0.869), 1 (-0.333), 6 (-0.2), 7 (+0.333), 3 (+0.5), 2 (+0.957)
    assert [r["line"] for r in result.rows] == [4, 1, 6, 7, 3, 2]
    assert result.rows[0]["bad_mean_count"] == pytest.approx(50.0)
    assert result.rows[0]["relative_difference"] == pytest.approx(-46.5 / 53.5)
    # correct (good strictly higher): pair 1 yes, 2 yes, 3 no, 4 no, 6 no (a tie), 7 no
    assert [r["correct"] for r in result.rows] == [False, True, False, False, False, True]
    assert result.third == 2
    assert result.lower_score == pytest.approx(0.5)  # pairs 4, 1
    assert result.middle_score == pytest.approx(0.0)  # pairs 6, 7
    assert result.upper_score == pytest.approx(0.5)  # pairs 3, 2
    assert result.bias == pytest.approx(0.0) and result.score == pytest.approx(2 / 6)
    assert result.skipped == {"added": 1}
    assert frequency_bias.skipped_text(result.skipped) == (
        "1 pairs skipped as no replacement (1 added)"
    )


def test_too_few_replacements_and_bad_json_lines_are_refused(tmp_path):
    pairs = [Pair(1, "a", "b"), Pair(2, "a b", "b a")]
    with pytest.raises(NaturalBiasError, match=r"1 replacement pairs left of 2 \(1 pairs skipped"):
        frequency_bias.frequency_bias(
            pairs, [([1], [2]), ([1, 2], [2, 1])], np.ones(3), [(0, 0)] * 2
        )
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"sentence_good": "a b", "sentence_bad": "a c"}\n{"sentence_good": "x"}\n')
    with pytest.raises(NaturalBiasError, match=r"pairs.jsonl:2: expected a JSON object"):
        frequency_bias.read_pairs(str(path))


# --- natbias-output-frequency --------------------------------------------------------

GENERATED = """S-1\tq r
T-1\ta b c
H-1\t-0.5\ta a a
D-1\t-0.5\ta a a
S-0\tq
T-0\tb d
H-0\t-0.2\tb e
"""


def test_output_frequency_of_fairseq_generate_output_by_hand(tmp_path):
    (tmp_path / "gen.txt").write_text(GENERATED, encoding="utf-8")
    (tmp_path / "train.txt").write_text("a a a a a b b c\na d\n", encoding="utf-8")
    # training counts: a 6, b 2, c 1, d 1, e 0; bins 0, 1-2, >=3
    result = fairseq(
        "natbias-output-frequency", tmp_path / "gen.txt", "--train-text", tmp_path / "train.txt",
        "--edges", "0", "1", "3", "--min-tokens", "2", "--out-dir", tmp_path / "out",
    )  # fmt: skip
    rows = read_csv(tmp_path / "out" / "output_frequency.csv")
    # produced: a a a, b e; references: a b c, b d
    assert [(r["bin"], r["produced"], r["reference"]) for r in rows] == [
        ("0", "1", "0"),  # e
        ("1-2", "1", "4"),  # b | b c b d
        (">=3", "3", "1"),  # a a a | a
    ]
    assert rows[0]["ratio"] == "nan" and float(rows[1]["ratio"]) == 0.25
    assert [r["few"] for r in rows] == ["True", "False", "True"]
    assert (tmp_path / "out" / "output_frequency.png").stat().st_size > 0
    assert "5 tokens produced, 5 in the references, 2 sentences" in result.stdout


@pytest.mark.parametrize(
    "edges, message",
    [
        (["5", "1"], "bin edges out of order: 5 1"),
        ([], "an empty bin set"),
        (["1000"], "no token falls in any bin (lower bounds 1000): every bin is empty"),
    ],
)
def test_output_frequency_bad_bins_one_line(tmp_path, edges, message):
    (tmp_path / "gen.txt").write_text(GENERATED, encoding="utf-8")
    (tmp_path / "train.txt").write_text("a b\n", encoding="utf-8")
    result = fairseq(
        "natbias-output-frequency", tmp_path / "gen.txt", "--train-text", tmp_path / "train.txt",
        "--edges", *edges, "--out-dir", tmp_path / "out", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("natbias-output-frequency: error: ") and message in line


def test_output_frequency_and_the_helps_start_without_torch(tmp_path):
    """natbias-output-frequency reads text only; the other two import a
    framework only to score models, not for --help."""
    (tmp_path / "gen.txt").write_text(GENERATED, encoding="utf-8")
    (tmp_path / "train.txt").write_text("a a b\n", encoding="utf-8")
    calls = [
        f"output_main([{str(tmp_path / 'gen.txt')!r}, '--train-text', "
        f"{str(tmp_path / 'train.txt')!r}, '--out-dir', {str(tmp_path / 'out')!r}])",
        "loss_parser().format_help(); bias_parser().format_help()",
    ]
    for call in calls:
        done = subprocess.run(
            [sys.executable, "-c", f"from natbias.tools.frequency import *; {call}"],
            cwd=REPO,
            env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1", PYTHONWARNINGS="ignore"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        imported = top_level_imports(done.stderr)
        assert "natbias" in imported and not imported & {"torch", "fairseq", "transformers"}
    assert (tmp_path / "out" / "output_frequency.csv").is_file()


def test_a_framework_not_installed_is_named_in_one_line(tmp_path):
    """fairseq checkpoints without fairseq, transformers folders without
    transformers: the extra to install, no traceback."""
    for name in ("fairseq", "transformers"):
        (tmp_path / "hidden" / name).mkdir(parents=True)
        (tmp_path / "hidden" / name / "__init__.py").write_text("raise ImportError('hidden')\n")
    (tmp_path / "ckpt.pt").write_bytes(b"")
    (tmp_path / "folder").mkdir()
    code = "\n".join(
        [
            "from natbias.tools.frequency import loss_main",
            "for argv in ([CKPT, CKPT, '--data', OUT], [FOLDER, FOLDER, '--text', CKPT]):",
            "    try:",
            "        loss_main([*argv, '--out-dir', OUT])",
            "    except SystemExit as stop:",
            "        print(stop.code)",
        ]
    )
    names = f"CKPT, FOLDER, OUT = {str(tmp_path / 'ckpt.pt')!r}, {str(tmp_path / 'folder')!r}, {str(tmp_path)!r}"
    done = subprocess.run(
        [sys.executable, "-c", f"{names}\n{code}"],
        env=dict(os.environ, PYTHONPATH=f"{tmp_path / 'hidden'}:{REPO}", PYTHONWARNINGS="ignore"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]
    fairseq_line, hf_line = done.stdout.strip().splitlines()
    assert fairseq_line.startswith(
        "natbias-loss-by-frequency: error: fairseq_natbias needs fairseq"
    )
    assert hf_line.startswith(
        "natbias-loss-by-frequency: error: transformers models need the [hf] extra: "
        "pip install 'fairseq-natbias[hf]'"
    )
