"""The paper's learning-efficiency claim, measured on real data against stock
fairseq (issues 6, 10 and 11), for translation and for language models.

Translation (--task translation): Multi30k (joint SentencePiece 8k; --pair
de-en or fr-en), a small transformer (2+2 layers, d = 128, tied embeddings).
Language modelling (--task lm): one side of Multi30k (--lang en, de or fr;
SentencePiece 8k), a small transformer LM (2 layers, d = 128, tied, blocks of
64 tokens). Each trained on the CPU through the real fairseq-train, for each
arm x seed under a learning-rate schedule:

arms
    ``stock``                   fairseq's own ``--arch transformer`` (or
                                ``transformer_lm``): what a user would
                                otherwise run; no bias
    ``WINIT/BIAS``              ``--arch transformer_natbias`` (or
                                ``transformer_lm_natbias``) with
                                ``--natbias-weight-init WINIT --natbias-init BIAS``,
                                e.g. ``gain/unigram``, ``fairseq/zero``; BIAS
                                ``bigram`` adds ``--natbias-order 2``,
                                ``frozen-unigram`` holds the unigram bias
                                fixed (``--natbias-freeze``)
    ``gain@G0,C/BIAS``          the ``gain`` init with ``--natbias-gain-init G0
                                --natbias-gain-speed C`` (for screening)
    ``gain@G0,C,FORM/BIAS``     the name of runs made before 1.0 with
                                ``--natbias-gain-form FORM`` (and
                                ``gain@G0,C,FORM,SCHED/BIAS``, a gain
                                schedule), both options retired: their
                                records in results/runs/ are summarised; a
                                new run of FORM abs-capped (SCHED lr) trains
                                the 1.0 gain, which is that one, under the
                                old name; any other FORM is refused
    ``.../BIAS~ALPHA``          any of these with ``--natbias-smoothing ALPHA``
                                (e.g. ``gain/unigram~2.42``)
    ``ARM+unigram-ls``          any arm, stock included, trained with
                                ``--criterion unigram_label_smoothed_cross_entropy``
                                (label smoothing towards the target unigram)
    ``ARM+unigram-ls@EPS``      ... with ``--label-smoothing EPS`` (default: the
                                task's, 0.1)
schedules (``--schedule``)
    ``short``  lr 1e-3, inverse-sqrt warm-up 100 updates (the demo's)
    ``paper``  lr 5e-4, inverse-sqrt warm-up 4,000 updates from 1e-7 (the
               paper's sec. 4.1 schedule, as in the recipes)

--preset iwslt trains the paper's IWSLT size instead of the small model
(translation): ``transformer_natbias_iwslt_de_en`` (sec. 4.1: 6+6 layers, 4
heads, FFN 256; d = 256, the package's choice) against stock fairseq's
``transformer`` at the same sizes (fairseq's own transformer_iwslt_de_en is
another network: d 512, FFN 1024), tied; runs and results are named
``<schedule>-iwslt``. With ``--schedule paper --max-tokens 4096`` it is the
paper's set-up.

--converge trains each run to convergence instead of for a fixed 1,000
updates: validation every 250 updates (and at each epoch's end, fairseq's
rule), the best checkpoint by validation NLL, and fairseq's ``--patience``
(default 6 validations without a lower NLL) stops the run, capped at 12,000
updates; no BLEU during training (it would cost more than the training
between validations); the best checkpoint scored on test_2016_flickr and
test_2017_flickr. "Updates to reach" then aims at stock's best validation
NLL, and its ratio is to stock's update of that best. Runs and results are
named ``<schedule>-converge``. ``--patience 0`` trains every arm for the same
budget, --max-update, instead: the fair comparison, since patience 6 stopped
stock while it was still improving (research/studies/convergence.md).

Measured per run, validating every --validate-every updates:

* validation NLL at update 0 (natbias-step0) and over updates, with the
  unigram cross-entropy of the validation targets for reference;
* translation: validation BLEU over updates (fairseq's own --eval-bleu:
  greedy, sacreBLEU 13a on detokenised SentencePiece, the whole validation
  set);
* ALC of the validation NLL (update 0 included) and, for translation, of the
  validation BLEU (from the first validation; the paper's Fig. 3 measure):
  trapezoidal rule divided by the span of updates (natbias-alc's);
* updates needed to reach the reference arm's (``stock``) validation NLL at
  its last update (mean over its seeds; interpolated; "never" if not reached);
* translation: test BLEU/chrF (sacreBLEU, with signatures) of the best
  checkpoint (highest validation BLEU: the paper's early stopping), beam 5;
  language model: test NLL and perplexity from fairseq-eval-lm of the best
  checkpoint (lowest validation loss);
* the gain g at the end, for the ``gain`` init.

Means and standard errors over seeds go to a Markdown table and plots in
--workdir/<pair or lm-lang>/<schedule>/; the runs to .../<schedule>/<arm>/seed<k>/.
Finished runs are skipped and an interrupted one resumes from its last
checkpoint, so the study runs in parts and extends run by run. --jobs runs
that many trainings side by side on --threads CPU threads each (on the 2-core
machine two 1-thread runs beat one 2-thread run after the other). With
--results DIR, each finished run's record (its curves and scores, a few kB of
JSON) is also kept in DIR/runs/<pair or lm-lang>_<schedule>/<arm>/seed<k>.json,
and a run whose folder is gone is summarised from there: seeds trained on
another machine, or before a lost /tmp, still count.

    .venv/bin/python research/study_learning_efficiency.py --pair de-en \\
        --schedule short --seeds 1 2 3 \\
        --arms stock gain/unigram gain/zero gain/none fairseq/unigram fairseq/zero fairseq/none
    .venv/bin/python research/study_learning_efficiency.py --task lm --lang en \\
        --seeds 1 2 3 --arms stock gain/unigram gain/zero fairseq/unigram
    .venv/bin/python research/study_learning_efficiency.py --pair fr-en --converge \\
        --patience 0 --max-update 20000 --seeds 1 2 3 --arms stock gain/unigram gain/zero
"""

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "paper"))  # make demo's pipeline
sys.path.insert(0, str(REPO / "research"))  # the study package, research/study/

# The study's parts (research/study/__init__.py says which holds what). The
# names tests/test_study_learning_efficiency.py reads from this script are
# imported here too, so that it reads the whole study from one place.
from multi30k import has_all_files  # noqa: E402
from study import parser_for  # noqa: E402
from study.arms import (  # noqa: E402,F401
    CONVERGE_TEST_SETS,
    EPOCHS_NEVER,
    PRESETS,
    SCHEDULES,
    Arm,
    LanguageModel,
    Translation,
    converge_options,
    first_pairs,
    vocabulary_for,
)
from study.runs import collect_runs, train_all, training_arguments  # noqa: E402,F401
from study.summary import (  # noqa: E402,F401
    from_update,
    markdown_converged,
    markdown_reach_by_horizon,
    reach_by_horizon,
    summarise,
    write_table_and_plots,
)


def main():
    parser = parser_for(__doc__)
    parser.add_argument("--workdir", default="work/study")
    parser.add_argument("--task", default="translation", choices=["translation", "lm"])
    parser.add_argument(
        "--pair", default="de-en", choices=["de-en", "fr-en"], help="with --task translation"
    )
    parser.add_argument("--lang", default="en", choices=["en", "de", "fr"], help="with --task lm")
    parser.add_argument("--schedule", default="short", choices=sorted(SCHEDULES))
    parser.add_argument(
        "--arms",
        nargs="+",
        default=[
            "stock",
            "gain/unigram",
            "gain/zero",
            "gain/none",
            "fairseq/unigram",
            "fairseq/zero",
            "fairseq/none",
        ],
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument(
        "--max-update",
        type=int,
        help="updates per run (default 1000; with --converge, the cap: 12000)",
    )
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument(
        "--validate-every",
        type=int,
        help="updates between validations (default 50; with --converge 250)",
    )
    parser.add_argument(
        "--converge",
        action="store_true",
        help="train each run to convergence (above); named <setting>-converge",
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=6,
        help="with --converge: validations without a lower NLL before a run "
        "stops; 0: every arm the same budget, --max-update",
    )
    parser.add_argument("--jobs", type=int, default=2, help="trainings side by side")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per training")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where fairseq trains and scores: cuda drops --cpu (a lent GPU "
        "machine, research/studies/gpu_check.md); such runs and results "
        "are named <setting>-cuda, apart from the CPU's, since the same "
        "seed gives other numbers there",
    )
    parser.add_argument(
        "--summarise-only",
        action="store_true",
        help="no training: the table and plots of the finished runs",
    )
    parser.add_argument("--results", help="also copy the table and plots to this folder")
    parser.add_argument(
        "--keep-updates",
        type=int,
        nargs="+",
        metavar="U",
        help="keep these updates' interval checkpoints (default: only the best and the last)",
    )
    parser.add_argument(
        "--train-pairs",
        type=int,
        metavar="N",
        help="the first N training pairs only (a small corpus; for "
        "--task lm the first N sentences of the language), "
        "SentencePiece vocabulary scaled with sqrt(N) (8,000 at "
        "29,000); runs and results are named <pair>_nN (lm-<lang>_nN)",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="translation at a paper size (above); named <schedule>-iwslt",
    )
    args = parser.parse_args()
    arms = [Arm.parse(text) for text in args.arms]
    if args.preset and args.task != "translation":
        raise SystemExit("study: --preset is for --task translation")
    if args.max_update is None:
        args.max_update = 12000 if args.converge else 1000
    if args.validate_every is None:
        args.validate_every = 250 if args.converge else 50
    task = (
        Translation(args.pair, CONVERGE_TEST_SETS[1:] if args.converge else ())
        if args.task == "translation"
        else LanguageModel(args.lang)
    )
    if args.preset:
        task.use_preset(args.preset)
    task.device = args.device
    if args.converge:
        task.options = [
            *converge_options(task.options, task.loss_key),
            "--patience",
            str(args.patience),
        ]
    raw = Path(args.multi30k)
    langs = task.langs if args.task == "translation" else (task.lang,)
    if not has_all_files(raw, langs):
        raise SystemExit(f"study: no Multi30k {'-'.join(langs)} at {raw}; give --multi30k DIR")
    if args.train_pairs:
        task.folder = f"{task.folder}_n{args.train_pairs}"
        task.vocab_size = vocabulary_for(args.train_pairs)
    work = Path(args.workdir).resolve() / task.folder
    work.mkdir(parents=True, exist_ok=True)
    if args.train_pairs:
        raw = first_pairs(raw, work / "raw", langs, args.train_pairs)
    setting = args.setting = (
        args.schedule
        + (f"-{args.preset}" if args.preset else "")
        + ("-converge" if args.converge else "")
        + ("-cuda" if args.device == "cuda" else "")
    )
    study_dir = work / setting
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    data_bin = task.prepare(raw, work)
    if not args.summarise_only:
        train_all(task, data_bin, work, study_dir, arms, args.seeds, args)
    archive = Path(args.results) / "runs" / f"{task.folder}_{setting}" if args.results else None
    runs = collect_runs(
        task,
        study_dir,
        arms,
        args.seeds,
        archive,
        with_bleu_curve=task.name == "translation" and not args.converge,
    )
    if args.task != "translation":
        size = (
            f"{args.train_pairs:,} sentences (SentencePiece {task.vocab_size:,}), "
            if args.train_pairs
            else ""
        )
        title = f"language model, Multi30k {args.lang}, {size}schedule {setting}"
    elif args.train_pairs:  # short enough for a plot's panel title
        title = (
            f"Multi30k {args.pair}, {args.train_pairs:,} pairs "
            f"(SentencePiece {task.vocab_size:,}), {setting}"
        )
    else:
        title = f"Multi30k {args.pair}, schedule {setting}"
    table, outputs = write_table_and_plots(
        task, runs, title, study_dir, args.converge, args.patience
    )
    if args.results:
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        for path in outputs.values():
            shutil.copy(path, results / f"{task.folder}_{setting}_{path.name}")
    print(table)
    print(
        f"outputs: {', '.join(str(p) for p in outputs.values())}; "
        f"command: {sys.executable} {' '.join(sys.argv)}"
    )


if __name__ == "__main__":
    main()
