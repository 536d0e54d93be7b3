"""The arguments the analysis tools share (natbias/tools/cli.py)."""

import pytest
import sweep
import sweep_lm

from natbias.tools import cli


@pytest.mark.parametrize(
    "tool, lambdas, shown",
    [
        (sweep, [1.0], "(default: 1)"),
        (sweep_lm, [0.0, 0.25, 0.5, 0.75, 1.0], "(default: 0 0.25 0.5 0.75 1)"),
    ],
)
def test_each_sweep_keeps_its_own_lambda_grid_and_says_it_in_the_help(tool, lambdas, shown):
    parser = tool.build_parser()
    args = parser.parse_args(["data", "model.pt", "--out-dir", "out"])
    assert (args.lambdas, args.taus, args.tokenize) == (lambdas, [0.0], "13a")
    assert shown in " ".join(parser.format_help().split())


def test_a_grid_and_tokenizer_given_on_the_command_line_are_read():
    args = sweep.build_parser().parse_args(
        [
            "data",
            "model.pt",
            "--out-dir",
            "out",
            "--lambdas",
            "0",
            "0.5",
            "--taus",
            "1",
            "--tokenize",
            "none",
        ]
    )
    assert (args.lambdas, args.taus, args.tokenize) == ([0.0, 0.5], [1.0], "none")


def test_an_unknown_tokenizer_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        cli.distinct_parser().parse_args(["texts.txt", "--tokenize", "moses"])
    assert "invalid choice: 'moses'" in capsys.readouterr().err
