"""Generation-time control of the frequency bias, swept with the real
``fairseq-generate``: quality (sacreBLEU BLEU and chrF, with signatures) and
diversity (distinct-n, D) side by side.

Two controls, both on the logits of the final layer:

bias scaling (lambda)
    Kobayashi et al. (2023), sec. 3.3: "we introduced an adjustment coefficient
    lambda in [0, 1] and replaced b_LN with lambda b_LN"; lambda = 1 is the
    model as trained, lambda = 0 drops the bias (only W phi).
post-hoc logit adjustment (tau)
    sec. 4.1, after Menon et al. (2021): subtracting the log label (here:
    token) frequency from the logits, tau log p_unigram, promotes rare tokens.

so that the logits are ``W phi + lambda b - tau log p_unigram`` (the model's
``target_log_unigram``). Both reach the model through fairseq's own
``--model-overrides "{'natbias_bias_scale': lambda, 'natbias_logit_adjustment': tau}"``,
which fairseq applies to the configuration it builds the model from when
loading the checkpoint (``TransformerNatbiasModel._controlled_logits`` reads
them). They are off by default (lambda = 1, tau = 0) and live only in that
generation run: fairseq-train has no such options, and generation writes no
checkpoint.

Output per setting: the raw fairseq-generate output
(``generate.lambda<l>.tau<t>.txt``), then ``sweep.tsv``, ``sweep.md`` and
``sweep.png`` over all settings. Hypotheses are the detokenised ``D-`` lines,
references the ``T-`` lines; the sweep passes ``--gen-subset`` and any other
fairseq-generate options through unchanged (e.g. ``--beam 5 --post-process
sentencepiece``), and adds ``--required-batch-size-multiple 1`` unless given one:
fairseq 0.12's ``batch_by_size`` drops a last batch whose size is not a multiple
of it (fairseq issue #5036): with the default 8, test sentences go missing.

With ``--temperature T`` other than 1, fairseq divides the logits by T before
the model adds ``(lambda - 1) b - tau log p_unigram``, so the controls are not
scaled by 1/T; the sweep is meant for T = 1.
"""

import glob
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from fairseq_natbias import checkpoint_loading, plugin_dir
from fairseq_natbias.analysis import AnalysisError, distinct, plots
from fairseq_natbias.analysis.generate_output import read_generate_output
from fairseq_natbias.analysis.quality import quality

BIAS_SCALE = "natbias_bias_scale"
LOGIT_ADJUSTMENT = "natbias_logit_adjustment"
STDERR_TAIL_LINES = 15


@dataclass(frozen=True)
class Setting:
    lam: float = 1.0
    tau: float = 0.0

    def overrides(self) -> str:
        return repr({BIAS_SCALE: self.lam, LOGIT_ADJUSTMENT: self.tau})

    @property
    def name(self) -> str:
        return f"lambda{self.lam:g}.tau{self.tau:g}"


def settings(lambdas: Sequence[float], taus: Sequence[float]) -> List[Setting]:
    """Every (lambda, tau) pair; lambda in [0, 1] as in Kobayashi et al."""
    for lam in lambdas:
        if not (math.isfinite(lam) and 0.0 <= lam <= 1.0):
            raise AnalysisError(f"lambda = {lam}: the bias scale must lie in [0, 1]")
    for tau in taus:
        if not math.isfinite(tau):
            raise AnalysisError(f"tau = {tau}: the logit adjustment must be a finite number")
    if not lambdas or not taus:
        raise AnalysisError("give at least one lambda and one tau")
    return [Setting(float(lam), float(tau)) for lam in lambdas for tau in taus]


# --- running fairseq-generate -------------------------------------------------------


def generate_executable() -> List[str]:
    """The fairseq-generate of this Python environment."""
    beside = os.path.join(os.path.dirname(sys.executable), "fairseq-generate")
    if os.path.isfile(beside):
        return [beside]
    found = shutil.which("fairseq-generate")
    return [found] if found else [sys.executable, "-m", "fairseq_cli.generate"]


def generate_command(data: str, checkpoint: str, setting: Setting,
                     generate_args: Sequence[str] = ()) -> List[str]:
    if any(arg.startswith("--model-overrides") for arg in generate_args):
        raise AnalysisError("the sweep sets --model-overrides itself; leave it out")
    if any(arg.startswith("--user-dir") for arg in generate_args):
        raise AnalysisError("the sweep passes --user-dir itself; leave it out")
    batching = [] if any(a.startswith("--required-batch-size-multiple") for a in generate_args) \
        else ["--required-batch-size-multiple", "1"]
    return [*generate_executable(), data, "--path", checkpoint, "--user-dir", plugin_dir(),
            "--model-overrides", setting.overrides(), *batching, *generate_args]


def split_sentences(data: str, split: str) -> Optional[int]:
    """How many sentences the binarised ``split`` holds (None: not found)."""
    from fairseq.data import data_utils

    first_shard = data.split(":")[0]
    found = sorted(glob.glob(os.path.join(first_shard, f"{split}.*-*.*.idx")))
    if not found:
        return None
    prefix = found[0][: -len(".idx")]
    if os.path.isfile(prefix + ".bin") and os.path.getsize(prefix + ".bin") == 0:
        return 0  # fairseq cannot even open it (numpy will not memory-map an empty file)
    dataset = data_utils.load_indexed_dataset(prefix, None)
    return None if dataset is None else len(dataset)


def run_generate(command: List[str], output_path: str) -> None:
    """Run fairseq-generate, its stdout into ``output_path``."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with open(output_path, "w", encoding="utf-8") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
    if result.returncode != 0:
        if "Weights only load failed" in result.stderr:
            raise AnalysisError("fairseq-generate could not load the checkpoint: "
                                + checkpoint_loading.WEIGHTS_ONLY_HINT)
        tail = "\n    ".join(result.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        raise AnalysisError(
            f"fairseq-generate failed (exit {result.returncode}):\n    {tail}\n"
            f"  command: {' '.join(command)}"
        )


# --- scoring one output ---------------------------------------------------------------


def score_output(path: str, tokenize: str = "13a") -> dict:
    """BLEU and chrF (sacreBLEU, with signatures) and distinct-n of one output."""
    sentences = read_generate_output(path)
    hypotheses = [s.detokenized if s.detokenized is not None else s.hypothesis
                  for s in sentences]
    scores = {"sentences": len(sentences),
              "mean_length": sum(len(h.split()) for h in hypotheses) / len(hypotheses)}
    scores.update(distinct.text_diversity(hypotheses, tokenize))
    references = [s.reference for s in sentences]
    if all(r is not None for r in references):
        scores.update(quality(hypotheses, references))
    return scores


# --- the sweep ------------------------------------------------------------------------


def sweep(data: str, checkpoint: str, grid: Sequence[Setting], out_dir: str,
          generate_args: Sequence[str] = (), tokenize: str = "13a", progress=None) -> List[dict]:
    checkpoint_loading.require_file(checkpoint)
    split = _gen_subset(generate_args)
    expected = split_sentences(data, split)
    if expected == 0:
        raise AnalysisError(f"the {split} split of {data} is empty: nothing to translate")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for i, setting in enumerate(grid, start=1):
        output = os.path.join(out_dir, f"generate.{setting.name}.txt")
        started = time.time()
        if progress:
            progress(f"[{i}/{len(grid)}] lambda={setting.lam:g} tau={setting.tau:g}: fairseq-generate")
        run_generate(generate_command(data, checkpoint, setting, generate_args), output)
        row = {"lambda": setting.lam, "tau": setting.tau, "output": output,
               "expected_sentences": expected}
        row.update(score_output(output, tokenize))
        rows.append(row)
        if expected is not None and row["sentences"] != expected and progress:
            progress(f"warning: {MISSING_NOTE.format(row['sentences'], expected, split)}")
        if progress:
            progress(f"[{i}/{len(grid)}] done in {time.time() - started:.0f}s: "
                     + _brief(row))
    return rows


MISSING_NOTE = (
    "fairseq-generate translated {} of the {} sentences of {}: fairseq 0.12 drops a "
    "last batch that is not a multiple of --required-batch-size-multiple (the sweep "
    "passes 1 unless told otherwise), and --skip-invalid-size-inputs-valid-test "
    "skips over-long sentences"
)


def _gen_subset(generate_args: Sequence[str]) -> str:
    args = list(generate_args)
    for i, arg in enumerate(args):
        if arg == "--gen-subset" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--gen-subset="):
            return arg.split("=", 1)[1]
    return "test"


def _brief(row) -> str:
    quality_part = (f"BLEU {row['BLEU']:.2f} chrF {row['chrF']:.2f} " if "BLEU" in row else "")
    return quality_part + f"D {row['D']:.3f}"


# --- output ---------------------------------------------------------------------------

COLUMNS = ("lambda", "tau", "BLEU", "chrF", "D1", "D2", "D3", "D4", "D", "sentences", "mean_length")


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if column in ("lambda", "tau") or not isinstance(value, float):
        return f"{value:g}"
    return f"{value:.4f}" if column.startswith("D") else f"{value:.2f}"


def table_tsv(rows: List[dict]) -> str:
    lines = ["\t".join(COLUMNS)]
    lines += ["\t".join(_cell(c, row.get(c)) for c in COLUMNS) for row in rows]
    return "\n".join(lines) + "\n"


def table_markdown(rows: List[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(c, row.get(c)) for c in COLUMNS) + " |" for row in rows]
    lines.append("")
    lines.append("lambda: output-bias scale; tau: logit adjustment (logits W phi + "
                 "lambda b - tau log p_unigram). D_n: distinct n-grams / n-grams over "
                 "all hypotheses; D: mean of D_1..D_4.")
    for row in rows:
        expected = row.get("expected_sentences")
        if expected is not None and row["sentences"] != expected:
            lines.append(f"\nlambda={row['lambda']:g} tau={row['tau']:g}: "
                         + MISSING_NOTE.format(row["sentences"], expected, "the split"))
    for key, name in (("bleu_signature", "BLEU"), ("chrf_signature", "chrF")):
        signatures = sorted({row[key] for row in rows if key in row})
        lines += [f"\nsacreBLEU {name} signature: `{s}`" for s in signatures]
    return "\n".join(lines) + "\n"


def write_sweep(rows: List[dict], out_dir: str) -> List[str]:
    paths = []
    for name, text in (("sweep.tsv", table_tsv(rows)), ("sweep.md", table_markdown(rows))):
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        paths.append(path)
    paths.append(plots.sweep_panels(rows, *_axes(rows), _plotted_metrics(rows),
                                    os.path.join(out_dir, "sweep.png")))
    return paths


def _axes(rows):
    lambdas = {row["lambda"] for row in rows}
    taus = {row["tau"] for row in rows}
    return ("lambda", "tau") if len(lambdas) >= len(taus) else ("tau", "lambda")


def _plotted_metrics(rows):
    metrics = [("D", "diversity D (mean distinct-1..4)")]
    if all("BLEU" in row for row in rows):
        metrics = [("BLEU", "BLEU"), ("chrF", "chrF")] + metrics
    return metrics
