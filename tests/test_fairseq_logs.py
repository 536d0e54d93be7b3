"""natbias.tools.fairseq_logs: fairseq-train logs in both formats."""

import pytest
from natbias_testing import train

from natbias.errors import NaturalBiasError
from natbias.tools import fairseq_logs

SIMPLE_LINES = """\
2026-01-01 10:00:00 | INFO | fairseq_cli.train | {'_name': None, 'common': {'log_format': 'simple'}}
2026-01-01 10:00:01 | INFO | train_inner | epoch 001:      1 / 2 loss=4.407, nll_loss=4.1, kl_unigram=0.009, bias_kl=0, num_updates=1, lr=0.0001
2026-01-01 10:00:02 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 4.541 | bleu 0.06 | num_updates 2
2026-01-01 10:00:03 | INFO | train | epoch 001 | loss 4.388 | num_updates 2 | lr 0.0002
2026-01-01 10:00:04 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 4.5 | bleu 1.5 | num_updates 4 | best_loss 4.5
"""

JSON_LINES = """\
2026-01-01 10:00:01 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "4.407", "kl_unigram": "0.009", "bias_kl": "0", "num_updates": "1"}
2026-01-01 10:00:02 | INFO | valid | {"epoch": 1, "valid_loss": "4.541", "valid_bleu": "0.06", "valid_num_updates": "2"}
2026-01-01 10:00:03 | INFO | train | {"epoch": 1, "train_loss": "4.388", "train_num_updates": "2"}
2026-01-01 10:00:04 | INFO | valid | {"epoch": 2, "valid_loss": "4.5", "valid_bleu": "1.5", "valid_num_updates": "4", "valid_best_loss": "4.5"}
"""


def _strip_prefix(text):
    """What --log-file holds: the messages without fairseq's console prefix."""
    return "\n".join(line.split(" | ", 3)[3] for line in text.splitlines())


def _hydra_prefix(text):
    """fairseq-hydra-train's console format: [DATE TIME,ms][TAG][LEVEL] - message."""
    lines = []
    for line in text.splitlines():
        when, level, tag, message = line.split(" | ", 3)
        lines.append(f"[{when},123][{tag}][{level}] - {message}")
    return "\n".join(lines)


def _summary(records):
    return [
        (r.tag, r.epoch, {k: r.values[k] for k in ("loss", "bleu", "num_updates") if k in r.values})
        for r in records
    ]


@pytest.mark.parametrize(
    "text",
    [
        SIMPLE_LINES,
        JSON_LINES,
        _strip_prefix(JSON_LINES),
        _strip_prefix(SIMPLE_LINES.split("\n", 1)[1]),
        _hydra_prefix(SIMPLE_LINES),
        _hydra_prefix(JSON_LINES),
    ],
)
def test_both_formats_with_and_without_prefix_give_the_same_records(text):
    records = fairseq_logs.parse_lines(text.splitlines())
    assert _summary(records) == [
        ("train_inner", 1, {"loss": 4.407, "num_updates": 1.0}),
        ("valid", 1, {"loss": 4.541, "bleu": 0.06, "num_updates": 2.0}),
        ("train", 1, {"loss": 4.388, "num_updates": 2.0}),
        ("valid", 2, {"loss": 4.5, "bleu": 1.5, "num_updates": 4.0}),
    ]


def test_config_dump_and_module_lines_are_not_records():
    line = SIMPLE_LINES.splitlines()[0]
    assert fairseq_logs.parse_line(line) is None
    assert (
        fairseq_logs.parse_line("2026-01-01 10:00:00 | INFO | fairseq.x | a | b 1 | num_updates 3")
        is None
    )


def test_resumed_run_keeps_the_last_value_of_a_repeated_update():
    resumed = SIMPLE_LINES + SIMPLE_LINES.splitlines()[-1].replace("bleu 1.5", "bleu 2.5") + "\n"
    updates, values = fairseq_logs.series(
        fairseq_logs.parse_lines(resumed.splitlines()), "valid", "bleu"
    )
    assert updates.tolist() == [2.0, 4.0]
    assert values.tolist() == [0.06, 2.5]


def test_missing_validation_lines_or_key_explain_themselves():
    records = fairseq_logs.parse_lines(SIMPLE_LINES.splitlines()[:2])
    with pytest.raises(NaturalBiasError, match="no validation lines"):
        fairseq_logs.validation_series(records, "x.log", "bleu")
    records = fairseq_logs.parse_lines(SIMPLE_LINES.splitlines())
    with pytest.raises(NaturalBiasError, match="no 'chrf'.*loss, bleu"):
        fairseq_logs.validation_series(records, "x.log", "chrf")


def test_metric_names_select_the_line_kind():
    assert fairseq_logs.split_metric("valid_bleu") == ("valid", "bleu")
    assert fairseq_logs.split_metric("kl_unigram") == ("train_inner", "kl_unigram")


@pytest.fixture(scope="session")
def real_logs(toy_bin, tmp_path_factory):
    """One tiny run per format: console output and --log-file of each."""
    root = tmp_path_factory.mktemp("logs")

    def run(fmt):
        return train(
            toy_bin,
            root / fmt,
            "--log-format",
            fmt,
            "--log-file",
            root / f"{fmt}.file",
            "--no-save",
            "--eval-bleu",
            "--eval-bleu-args",
            '{"beam": 1, "max_len_b": 5}',
            max_update=4,
        )

    logs = {}
    for fmt in ("simple", "json"):
        result = run(fmt)
        logs[fmt] = result.stdout + result.stderr
        logs[fmt + " --log-file"] = (root / f"{fmt}.file").read_text()
    return logs


@pytest.mark.training
def test_real_fairseq_logs_parse_alike_in_every_format(real_logs):
    """Same seed, same numbers: every format must yield the same series."""
    wanted = [
        ("valid", "bleu"),
        ("valid", "loss"),
        ("train_inner", "loss"),
        ("train_inner", "kl_unigram"),
        ("train_inner", "bias_norm"),
    ]
    parsed = {name: fairseq_logs.parse_lines(text.splitlines()) for name, text in real_logs.items()}
    reference = parsed["simple"]
    for tag, key in wanted:
        expected = fairseq_logs.series(reference, tag, key)
        assert len(expected[0]) >= 2, (tag, key)
        for name, records in parsed.items():
            got = fairseq_logs.series(records, tag, key)
            assert got[0].tolist() == expected[0].tolist(), (name, tag, key)
            assert got[1].tolist() == expected[1].tolist(), (name, tag, key)
