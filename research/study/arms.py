"""What the study compares and under which settings: the learning-rate
schedules, the paper-size --preset, the arms (stock fairseq or one of this
package's inits), the two tasks (Translation, LanguageModel) with their
fairseq options and data preparation, the options of a --converge run, and
the data-size helpers of --train-pairs (see the script's docstring for the
meaning of each)."""

import dataclasses
import gzip
import json
import math
import re
from dataclasses import dataclass
from typing import Optional

import pipeline
from multi30k import SPLIT_FILES, raw_file, read_lines
from pipeline import say

from fairseq_natbias.options import BIAS_INITS

SCHEDULES = {
    "short": {"--lr": "1e-3", "--warmup-updates": "100"},
    "paper": {"--lr": "5e-4", "--warmup-updates": "4000", "--warmup-init-lr": "1e-7"},
}
REFERENCE_ARM = "stock"
# Greedy and length-capped: an untrained model's validation translations
# would otherwise run to fairseq's default limit of 200 tokens. The best
# checkpoint is the one with the best validation BLEU, as in the paper's
# early stopping (sec. 4.1).
EVAL_BLEU = [
    "--eval-bleu",
    "--eval-bleu-args",
    '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}',
    "--eval-bleu-remove-bpe",
    "sentencepiece",
    "--best-checkpoint-metric",
    "bleu",
    "--maximize-best-checkpoint-metric",
]


# --preset: this package's architecture at one of the paper's sizes, and
# those sizes spelt out, for stock fairseq's ``transformer`` to match
# (tests/test_study_learning_efficiency.py checks they are the preset's).
PRESETS = {
    "iwslt": (
        "transformer_natbias_iwslt_de_en",
        (
            "--encoder-layers 6 --decoder-layers 6 --encoder-embed-dim 256 --decoder-embed-dim 256 "
            "--encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 "
            "--encoder-attention-heads 4 --decoder-attention-heads 4"
        ).split(),
    )
}
# --converge scores the best checkpoint on both Multi30k test sets (the first
# is the data-bin's own test split).
CONVERGE_TEST_SETS = ("test_2016_flickr", "test_2017_flickr")


# --train-pairs: the SentencePiece vocabulary for a corpus of N training pairs.
# 8,000 pieces at Multi30k's 29,000 pairs (every earlier study), scaled with
# the square root of N (Heaps' law: types grow about as sqrt(tokens)) and
# rounded to 500: 2,500 at 3,000 pairs, 4,500 at 10,000.
FULL_PAIRS, FULL_VOCABULARY = 29000, 8000
EPOCHS_NEVER = 1000000


def vocabulary_for(pairs):
    """Joint SentencePiece vocabulary for ``pairs`` training pairs (see above)."""
    scaled = FULL_VOCABULARY * math.sqrt(min(pairs, FULL_PAIRS) / FULL_PAIRS)
    return int(max(500, 500 * round(scaled / 500)))


def first_pairs(raw, folder, langs, pairs):
    """A raw-text folder whose training text is the first ``pairs`` lines of
    ``raw``'s (each language alike, so they stay aligned) and whose other
    splits link to ``raw``'s; made once, reused."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in [*SPLIT_FILES.values(), *CONVERGE_TEST_SETS[1:]]:
        for lang in langs:
            source = raw_file(raw, name, lang)
            if source is None:
                continue
            target = folder / source.name
            if name == SPLIT_FILES["train"]:
                target = folder / f"{name}.{lang}.gz"  # written gzipped, whatever the source
                lines = read_lines(source)
                if len(lines) < pairs:
                    raise SystemExit(
                        f"study: --train-pairs {pairs}: {source} has only {len(lines)} lines"
                    )
                if not target.exists():
                    with gzip.open(target, "wt", encoding="utf-8") as out:
                        out.write("\n".join(lines[:pairs]) + "\n")
            elif not target.exists():
                target.symlink_to(source.resolve())
    return folder


def on_device(options, device):
    """``options`` (a list of fairseq arguments) for ``device``: as they are
    on the CPU; for "cuda" without ``--cpu``, so fairseq trains, validates,
    generates and evaluates on the GPU (everything else alike)."""
    return [o for o in options if device == "cpu" or o != "--cpu"]


def converge_options(options, loss_key):
    """The task's options for a --converge run: no BLEU during training (at
    every validation it would cost more than the training between them), the
    best checkpoint by validation NLL, which --patience watches. (No model
    option or value is one of EVAL_BLEU's words.)"""
    return [o for o in options if o not in EVAL_BLEU] + ["--best-checkpoint-metric", loss_key]


class Translation:
    """Multi30k SRC->TGT with transformer(_natbias)."""

    name = "translation"
    stock_arch, natbias_arch = "transformer", "transformer_natbias"
    loss_key = "nll_loss"  # label_smoothed_cross_entropy's NLL, bits
    device = "cpu"  # or "cuda" (--device): see on_device
    options = [*pipeline.MODEL, *EVAL_BLEU]

    def __init__(self, pair, extra_test_sets=()):
        self.langs = tuple(pair.split("-"))
        self.folder = pair
        self.extra_test_sets = tuple(extra_test_sets)
        self.vocab_size = FULL_VOCABULARY

    def use_preset(self, preset):
        """The paper-size preset for the natbias arms, its sizes for stock's
        ``transformer``; tied as before."""
        self.natbias_arch, sizes = PRESETS[preset]
        self.options = [*sizes, "--share-all-embeddings", *EVAL_BLEU]

    def prepare(self, raw, work):
        data_bin = pipeline.prepare(raw, work, vocab_size=self.vocab_size, langs=self.langs)
        for test_set in self.extra_test_sets:
            pipeline.prepare_test_set(raw, work, data_bin, self.langs, test_set)
        return data_bin

    def training(self):
        return on_device(pipeline.TRAINING, self.device)

    def evaluate(self, data_bin, work, run_dir, name):
        cpu = self.device == "cpu"
        pipeline.evaluate(data_bin, work, run_dir, name, target=self.langs[1], cpu=cpu)
        for test_set in self.extra_test_sets:
            pipeline.evaluate(
                data_bin, work, run_dir, name, target=self.langs[1], test_set=test_set, cpu=cpu
            )

    def test_scores(self, run_dir):
        scores = json.loads((run_dir / "test_scores.json").read_text())
        for test_set in self.extra_test_sets:
            extra = json.loads((run_dir / f"{test_set}_scores.json").read_text())
            scores.update({f"{key}_{test_set}": value for key, value in extra.items()})
        return scores

    def finished(self, run_dir):
        return all(
            (run_dir / name).exists()
            for name in ["test_scores.json", *(f"{t}_scores.json" for t in self.extra_test_sets)]
        )


class LanguageModel:
    """One language of Multi30k with transformer_lm(_natbias)."""

    name = "lm"
    stock_arch, natbias_arch = "transformer_lm", "transformer_lm_natbias"
    loss_key = "loss"  # cross_entropy's loss, bits
    device = "cpu"
    # Input/output dims and pre-norm spelt out: fairseq 0.12 builds stock
    # ``--arch transformer_lm`` from its dataclass defaults (512-dim input and
    # output embeddings, post-norm) whatever --decoder-embed-dim says, while
    # transformer_lm_natbias applies base_lm_architecture as fairseq meant
    # (dims follow the embedding, pre-norm). Explicit, both build one network.
    options = [
        "--decoder-layers",
        "2",
        "--decoder-embed-dim",
        "128",
        "--decoder-input-dim",
        "128",
        "--decoder-output-dim",
        "128",
        "--decoder-normalize-before",
        "--decoder-ffn-embed-dim",
        "256",
        "--decoder-attention-heads",
        "4",
        "--share-decoder-input-output-embed",
    ]

    def __init__(self, lang):
        self.lang = lang
        self.folder = f"lm-{lang}"
        self.vocab_size = FULL_VOCABULARY

    def prepare(self, raw, work):
        return pipeline.prepare_lm(raw, work, vocab_size=self.vocab_size, lang=self.lang)

    def training(self):
        training = on_device(pipeline.TRAINING, self.device)
        for option in ("--criterion", "--label-smoothing"):
            index = training.index(option)
            del training[index : index + 2]
        return [
            *training,
            "--task",
            "language_modeling",
            "--tokens-per-sample",
            "64",
            "--sample-break-mode",
            "none",
            "--criterion",
            "cross_entropy",
        ]

    def evaluate(self, data_bin, work, run_dir, name):
        """Test NLL (bits) and perplexity of the best checkpoint, fairseq-eval-lm."""
        scores_path = run_dir / "test_scores.json"
        if scores_path.exists():
            return
        say(f"eval-lm [{name}]: test split")
        output = pipeline.run(
            [
                *pipeline.tool("fairseq-eval-lm"),
                str(data_bin),
                "--user-dir",
                "fairseq_natbias",
                "--path",
                str(run_dir / "checkpoint_best.pt"),
                "--gen-subset",
                "test",
                *on_device(["--cpu"], self.device),
                "--max-tokens",
                "4096",
                "--tokens-per-sample",
                "64",
                "--num-workers",
                "0",
            ]
        )
        match = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", output)
        if not match:
            raise SystemExit(f"study: no loss in fairseq-eval-lm's output:\n{output[-2000:]}")
        scores_path.write_text(json.dumps({"nll": float(match[1]), "ppl": float(match[2])}))

    def test_scores(self, run_dir):
        return json.loads((run_dir / "test_scores.json").read_text())

    def finished(self, run_dir):
        return (run_dir / "test_scores.json").exists()


# ARM+NAME: the arm trained with this criterion instead of the task's own
# (label_smoothed_cross_entropy, eps 0.1; cross_entropy for a language model);
# the eps of the task's --label-smoothing, 0.1 for a language model, unless
# the name ends in @EPS (ARM+unigram-ls@0.2).
CRITERIA = {"unigram-ls": ["--criterion", "unigram_label_smoothed_cross_entropy"]}


# gain@G0,C,FORM[,SCHED]/BIAS: the gain's form (and schedule) of a run made
# before 1.0, when --natbias-gain-form and --natbias-gain-schedule existed. Such
# a name reads that run's records (results/runs/). The one form 1.0 has is
# abs-capped under the lr schedule: an arm naming it trains the 1.0 gain, its
# new seeds filed beside the earlier ones; any other form names records only.
CURRENT_FORMS = ("abs-capped", "abs-capped,lr")


@dataclass(frozen=True)
class Arm:
    """One configuration of the comparison (see the module docstring)."""

    name: str
    weight_init: Optional[str] = None
    bias: Optional[str] = None
    gain_init: Optional[str] = None
    gain_speed: Optional[str] = None
    form: Optional[str] = None  # FORM[,SCHED] of a record made before 1.0
    smoothing: Optional[str] = None
    criterion: Optional[str] = None  # ARM+unigram-ls: see CRITERIA
    epsilon: Optional[str] = None  # ARM+unigram-ls@EPS: its --label-smoothing

    @classmethod
    def parse(cls, text):
        base, plus, criterion = text.partition("+")
        if plus:
            criterion, at, epsilon = criterion.partition("@")
            if criterion not in CRITERIA or (at and not re.fullmatch(r"0?\.\d*[1-9]\d*", epsilon)):
                raise SystemExit(
                    f"study: bad arm {text!r}: after + give one of "
                    f"{', '.join(CRITERIA)}, optionally @EPS (0 < EPS < 1)"
                )
            return dataclasses.replace(
                cls.parse(base), name=text, criterion=criterion, epsilon=epsilon or None
            )
        if text == REFERENCE_ARM:
            return cls(text)
        match = re.fullmatch(
            r"(\w+)(?:@([\d.e-]+),([\d.e-]+)(?:,([a-z-]+(?:,[a-z]+)?))?)?"
            r"/(unigram|zero|none|bigram|frozen-unigram)(?:~([\d.]+))?",
            text,
        )
        if not match:
            raise SystemExit(
                f"study: bad arm {text!r}: give stock, WINIT/BIAS or "
                "gain@G0,C/BIAS, BIAS optionally ending in ~ALPHA"
            )
        weight_init, gain_init, gain_speed, form, bias, smoothing = match.groups()
        return cls(text, weight_init, bias, gain_init, gain_speed, form, smoothing)

    @property
    def folder(self):
        return self.name.replace("/", "-").replace("@", "_").replace(",", "_")

    def criterion_arguments(self):
        """The criterion replacing the task's own (after its options, so it
        wins): none unless the arm names one."""
        if not self.criterion:
            return []
        epsilon = ["--label-smoothing", self.epsilon] if self.epsilon else []
        return CRITERIA[self.criterion] + epsilon

    def model_arguments(self, task):
        if self.weight_init is None:  # stock, with or without a criterion of its own
            return ["--arch", task.stock_arch]
        if self.form and self.form not in CURRENT_FORMS:
            raise SystemExit(
                f"study: arm {self.name!r} names runs of the gain form "
                f"{self.form!r}, which 1.0 does not have: its records can be "
                "summarised (--summarise-only), not trained; 1.0's gain (abs-capped) "
                "is gain@G0,C/BIAS"
            )
        # BIAS "bigram": the unigram bias plus the bigram residual (--natbias-order 2);
        # "frozen-unigram": the unigram bias held fixed for the whole run (--natbias-freeze).
        options = [
            "--arch",
            task.natbias_arch,
            "--natbias-init",
            self.bias if self.bias in BIAS_INITS else "unigram",
            "--natbias-weight-init",
            self.weight_init,
        ]
        if self.bias == "bigram":
            options += ["--natbias-order", "2"]
        if self.bias == "frozen-unigram":
            options += ["--natbias-freeze"]
        if self.gain_init:
            options += [
                "--natbias-gain-init",
                self.gain_init,
                "--natbias-gain-speed",
                self.gain_speed,
            ]
        if self.smoothing:
            options += ["--natbias-smoothing", self.smoothing]
        return options
