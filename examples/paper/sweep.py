"""Generation-time control of the frequency bias, swept with the real
``fairseq-generate``: quality (sacreBLEU BLEU and chrF) and diversity
(distinct-n, D) side by side, for logits ``W phi + lambda b - tau log p_unigram``::

    python examples/paper/sweep.py data-bin/iwslt14.de-en runs/iwslt/unigram/seed1/checkpoint_best.pt \\
        --lambdas 0 0.25 0.5 0.75 1 --taus 0 --out-dir analysis/sweep \\
        -- --beam 5 --batch-size 64 --post-process sentencepiece

lambda, bias scaling
    Kobayashi et al. (2023), sec. 3.3: "we introduced an adjustment coefficient
    lambda in [0, 1] and replaced b_LN with lambda b_LN".
tau, post-hoc logit adjustment
    sec. 4.1, after Menon et al. (2021): subtracting tau times the log token
    frequency promotes rare tokens.

Every (lambda, tau) pair is one fairseq-generate run with
--model-overrides "{'natbias_bias_scale': lambda, 'natbias_logit_adjustment': tau}"
(lambda = 1, tau = 0: the model as trained; with ``--temperature T`` the
controls are not scaled by 1/T). Options after `--` go to fairseq-generate
unchanged. Written to --out-dir: generate.lambda<l>.tau<t>.txt (raw output),
sweep.tsv, sweep.md and sweep.png.
"""

import glob
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pipeline
from quality import quality

from fairseq_natbias import checkpoint_loading, plugin_dir
from fairseq_natbias.natural_bias import BIAS_SCALE, LOGIT_ADJUSTMENT
from natbias.errors import NaturalBiasError
from natbias.tools import cli, distinct, plots
from natbias.tools.generate_output import GeneratedSentence, parse_generate_output, read_text_lines

STDERR_TAIL_LINES = 15
COLUMNS = ("lambda", "tau", "BLEU", "chrF", "D1", "D2", "D3", "D4", "D", "sentences", "mean_length")
MISSING_NOTE = (
    "fairseq-generate translated {} of the {} sentences of {}: fairseq 0.12 drops a "
    "last batch that is not a multiple of --required-batch-size-multiple (the sweep "
    "passes 1 unless told otherwise), and --skip-invalid-size-inputs-valid-test "
    "skips over-long sentences"
)


@dataclass(frozen=True)
class Setting:
    lam: float = 1.0
    tau: float = 0.0

    def overrides(self) -> str:
        return repr({BIAS_SCALE: self.lam, LOGIT_ADJUSTMENT: self.tau})

    @property
    def name(self) -> str:
        return f"lambda{self.lam:g}.tau{self.tau:g}"


def settings(lambdas: Sequence[float], taus: Sequence[float]) -> list[Setting]:
    """Every (lambda, tau) pair; lambda in [0, 1] as in Kobayashi et al."""
    for lam in lambdas:
        if not (math.isfinite(lam) and 0.0 <= lam <= 1.0):
            raise NaturalBiasError(f"lambda = {lam}: the bias scale must lie in [0, 1]")
    for tau in taus:
        if not math.isfinite(tau):
            raise NaturalBiasError(f"tau = {tau}: the logit adjustment must be a finite number")
    if not lambdas or not taus:
        raise NaturalBiasError("give at least one lambda and one tau")
    return [Setting(float(lam), float(tau)) for lam in lambdas for tau in taus]


def generate_command(
    data: str, checkpoint: str, setting: Setting, generate_args: Sequence[str] = ()
) -> list[str]:
    if any(arg.startswith("--model-overrides") for arg in generate_args):
        raise NaturalBiasError("the sweep sets --model-overrides itself; leave it out")
    if any(arg.startswith("--user-dir") for arg in generate_args):
        raise NaturalBiasError("the sweep passes --user-dir itself; leave it out")
    # fairseq 0.12 drops a last batch that is not a multiple of this (fairseq issue #5036)
    batching = (
        []
        if any(a.startswith("--required-batch-size-multiple") for a in generate_args)
        else ["--required-batch-size-multiple", "1"]
    )
    return [
        *pipeline.tool("fairseq-generate"),
        data,
        "--path",
        checkpoint,
        "--user-dir",
        plugin_dir(),
        "--model-overrides",
        setting.overrides(),
        *batching,
        *generate_args,
    ]


def split_sentences(data: str, split: str) -> Optional[int]:
    """How many sentences the binarised ``split`` holds (None: not found)."""
    from fairseq.data import data_utils

    found = sorted(glob.glob(os.path.join(data.split(":")[0], f"{split}.*-*.*.idx")))
    if not found:
        return None
    prefix = found[0][: -len(".idx")]
    if os.path.isfile(prefix + ".bin") and os.path.getsize(prefix + ".bin") == 0:
        return 0  # fairseq cannot even open it (numpy will not memory-map an empty file)
    dataset = data_utils.load_indexed_dataset(prefix, None)
    return None if dataset is None else len(dataset)


def run_generate(command: list[str], output_path: str) -> None:
    """Run fairseq-generate, its stdout into ``output_path``."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with open(output_path, "w", encoding="utf-8") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
    if result.returncode != 0:
        if "Weights only load failed" in result.stderr:
            raise NaturalBiasError(
                "fairseq-generate could not load the checkpoint: "
                + checkpoint_loading.WEIGHTS_ONLY_HINT
            )
        tail = "\n    ".join(result.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        raise NaturalBiasError(
            f"fairseq-generate failed (exit {result.returncode}):\n    {tail}\n"
            f"  command: {' '.join(command)}"
        )


def read_generate_output(path: str) -> list[GeneratedSentence]:
    """The sentences of one fairseq-generate output file, ordered by id."""
    if not os.path.isfile(path):
        raise NaturalBiasError(f"{path}: no such fairseq-generate output")
    sentences = parse_generate_output(read_text_lines(path, "fairseq-generate's output"))
    hypotheses = [sentences[i] for i in sorted(sentences) if sentences[i].hypothesis is not None]
    if not hypotheses:
        raise NaturalBiasError(
            f"{path} holds no hypotheses (H-<id> lines): the test set is empty, or "
            "this is not fairseq-generate output"
        )
    return hypotheses


def score_output(path: str, tokenize: str = "13a") -> dict:
    """BLEU and chrF (sacreBLEU, with signatures) and distinct-n of one output."""
    sentences = read_generate_output(path)
    hypotheses = [s.detokenized if s.detokenized is not None else s.hypothesis for s in sentences]
    scores = {
        "sentences": len(sentences),
        "mean_length": sum(len(h.split()) for h in hypotheses) / len(hypotheses),
    }
    scores.update(distinct.text_diversity(hypotheses, tokenize))
    references = [s.reference for s in sentences]
    if all(r is not None for r in references):
        scores.update(quality(hypotheses, references))
    return scores


def sweep(
    data: str,
    checkpoint: str,
    grid: Sequence[Setting],
    out_dir: str,
    generate_args: Sequence[str] = (),
    tokenize: str = "13a",
    progress=None,
) -> list[dict]:
    """One fairseq-generate run per setting, its output in
    ``generate.lambda<l>.tau<t>.txt``, and one row of scores each."""
    checkpoint_loading.require_file(checkpoint)
    split = _gen_subset(list(generate_args))
    expected = split_sentences(data, split)
    if expected == 0:
        raise NaturalBiasError(f"the {split} split of {data} is empty: nothing to translate")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for i, setting in enumerate(grid, start=1):
        output = os.path.join(out_dir, f"generate.{setting.name}.txt")
        started = time.time()
        if progress:
            progress(
                f"[{i}/{len(grid)}] lambda={setting.lam:g} tau={setting.tau:g}: fairseq-generate"
            )
        run_generate(generate_command(data, checkpoint, setting, generate_args), output)
        row = {
            "lambda": setting.lam,
            "tau": setting.tau,
            "output": output,
            "expected_sentences": expected,
        }
        row.update(score_output(output, tokenize))
        rows.append(row)
        if expected is not None and row["sentences"] != expected and progress:
            progress(f"warning: {MISSING_NOTE.format(row['sentences'], expected, split)}")
        if progress:
            brief = f"BLEU {row['BLEU']:.2f} chrF {row['chrF']:.2f} " if "BLEU" in row else ""
            progress(
                f"[{i}/{len(grid)}] done in {time.time() - started:.0f}s: "
                + brief
                + f"D {row['D']:.3f}"
            )
    return rows


def _gen_subset(args: list[str]) -> str:
    for flag, value in zip(args, [*args[1:], None]):
        if flag == "--gen-subset" and value is not None:
            return value
        if flag.startswith("--gen-subset="):
            return flag.split("=", 1)[1]
    return "test"


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if column in ("lambda", "tau") or not isinstance(value, float):
        return f"{value:g}"
    if column.startswith("D"):
        return f"{value:.4f}"
    return f"{value:.3f}" if column == "ref_nll" else f"{value:.2f}"


def write_tables(rows: list[dict], out_dir: str, name: str, columns, notes, metrics) -> list[str]:
    """``name``.tsv, ``name``.md (the table, ``notes``, the sacreBLEU signatures)
    and ``name``.png (one panel per metric against lambda or tau)."""
    cells = [[_cell(c, row.get(c)) for c in columns] for row in rows]
    tsv = "\n".join("\t".join(line) for line in [columns, *cells]) + "\n"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(line) + " |" for line in cells] + ["", *notes]
    for key, label in (("bleu_signature", "BLEU"), ("chrf_signature", "chrF")):
        lines += [
            f"\nsacreBLEU {label} signature: `{s}`"
            for s in sorted({row[key] for row in rows if key in row})
        ]
    paths = []
    for suffix, text in ((".tsv", tsv), (".md", "\n".join(lines) + "\n")):
        paths.append(os.path.join(out_dir, name + suffix))
        Path(paths[-1]).write_text(text, encoding="utf-8")
    axes = (
        ("lambda", "tau")
        if len({r["lambda"] for r in rows}) >= len({r["tau"] for r in rows})
        else ("tau", "lambda")
    )
    paths.append(sweep_panels(rows, *axes, metrics, os.path.join(out_dir, name + ".png")))
    return paths


def sweep_panels(
    rows: list[dict], x_key: str, line_key: str, metrics: Sequence[tuple[str, str]], path: str
) -> str:
    """One panel per ``(metric key, label)``; x = ``x_key``, one line per ``line_key``."""
    fig, axes = plots.grid(rows, path, cols=len(metrics))
    line_values = sorted({row[line_key] for row in rows})
    for ax, (key, label) in zip(axes[0], metrics):
        for i, value in enumerate(line_values):
            points = sorted((r[x_key], r[key]) for r in rows if r[line_key] == value)
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                "o-",
                color=plots.color_of(i),
                label=f"{_greek(line_key)} = {value:g}",
            )
        ax.set_xlabel(_greek(x_key))
        ax.set_ylabel(label)
        if len(line_values) > 1:
            ax.legend(fontsize="small")
    return plots.save(fig, path)


def _greek(key: str) -> str:
    return {"lambda": "λ (bias scale)", "tau": "τ (logit adjustment)"}.get(key, key)


def write_sweep(rows: list[dict], out_dir: str) -> list[str]:
    notes = [
        "lambda: output-bias scale; tau: logit adjustment (logits W phi + "
        "lambda b - tau log p_unigram). D_n: distinct n-grams / n-grams over "
        "all hypotheses; D: mean of D_1..D_4."
    ]
    notes += [
        f"\nlambda={row['lambda']:g} tau={row['tau']:g}: "
        + MISSING_NOTE.format(row["sentences"], row["expected_sentences"], "the split")
        for row in rows
        if row.get("expected_sentences") not in (None, row["sentences"])
    ]
    metrics = [("D", "diversity D (mean distinct-1..4)")]
    if all("BLEU" in row for row in rows):
        metrics = [("BLEU", "BLEU"), ("chrF", "chrF")] + metrics
    return write_tables(rows, out_dir, "sweep", COLUMNS, notes, metrics)


def add_grid_arguments(parser, default_lambdas) -> None:
    """``--lambdas`` (output-bias scales) and ``--taus`` (logit adjustments) of the sweeps."""
    what = "output-bias scales in [0, 1]"
    cli.add_values_argument(parser, "--lambdas", float, default_lambdas, "L", what)
    cli.add_values_argument(parser, "--taus", float, [0.0], "T", "logit adjustments")


def split_passthrough(argv):
    """``(own arguments, arguments after "--")``."""
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, []


def has_output_bias(path: str) -> bool:
    """Whether the checkpoint's output layer has a bias; a file torch cannot
    read is refused (CheckpointError), as fairseq would refuse it later."""
    state = checkpoint_loading.read_checkpoint(path)
    return "decoder.output_projection.bias" in state.get("model", {})


PROG = "examples/paper/sweep.py"


def build_parser():
    parser = cli.parser_for(PROG, __doc__)
    parser.add_argument("data", help="fairseq data directory (binarised)")
    parser.add_argument("checkpoint", help="model checkpoint (.pt)")
    add_grid_arguments(parser, default_lambdas=[1.0])
    parser.add_argument("--gen-subset", default="test", help="split to translate (default: test)")
    cli.add_tokenize_argument(parser, "word splitting for distinct-n")
    parser.add_argument("--out-dir", required=True, help="directory for outputs and tables")
    return parser


def run(args):
    grid = settings(args.lambdas, args.taus)
    # read first: a file that is no checkpoint is refused in one line
    if not has_output_bias(args.checkpoint) and any(s.lam != 1 for s in grid):
        print(
            f"{PROG}: note: {args.checkpoint} has no output bias, so lambda changes "
            "nothing; only tau does",
            file=sys.stderr,
        )
    rows = sweep(
        args.data,
        args.checkpoint,
        grid,
        args.out_dir,
        ["--gen-subset", args.gen_subset, *args.generate_args],
        args.tokenize,
        progress=cli.progress_on_stderr(PROG),
    )
    paths = write_sweep(rows, args.out_dir)
    cli.print_written(paths, Path(paths[1]).read_text(encoding="utf-8"))  # the Markdown table
    return rows


def main(argv=None):
    argv, generate_args = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.generate_args = generate_args
    cli.exit_on_bad_input(PROG, run, args)


if __name__ == "__main__":
    main()
