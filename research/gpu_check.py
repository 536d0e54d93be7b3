"""Issue 18's GPU check in one command: does the default train under half
precision as stock fairseq does, at the IWSLT preset, on a CUDA GPU?

    python research/gpu_check.py --multi30k DIR --workdir work/gpu_check

(any Python with torch, fairseq and this package importable: a virtual
environment, or packages installed with ``pip install --target`` and found
through PYTHONPATH; research/studies/gpu_check.md gives the device command,
``make gpu-prep`` the wheels and data it carries.)

What it runs (through the real fairseq; Multi30k De-En, joint SentencePiece
8k, fairseq-preprocess --joined-dictionary, as fairseq_natbias/pipeline.py
prepares it for the demo and the study; --data DIR reuses data prepared
before, e.g. by ``--prepare-only``):

* ``--arch transformer_natbias_iwslt_de_en`` (the default) and stock
  ``--arch transformer`` given the preset's sizes (6+6 layers, d 256, FFN
  256, 4 heads: the same network), both ``--share-all-embeddings``, the
  paper's optimiser and regularisation with a 100-update warm-up (so that
  the gain can reach its working range within the run), --max-update updates
  (300) in fp32 (reference) and each of ``--fp16``, ``--bf16``, ``--amp``
  (--precisions picks). Per precision the arms alternate, default, stock,
  stock, default (--rounds times), then one default run with
  --no-natbias-logging (the hook's share of memory and time), and at fp16
  and bf16 one with ``--natbias-order 2`` (the bigram residual, added in
  float32: does it train in half precision, at what cost). fp16 and amp
  start at loss scale 65536 and try to grow it every 25 clean updates, so
  both arms must find their level and keep finding it;
* each training in a child process, research/gpu_check_child.py, that
  calls ``fairseq_cli.train.cli_main()`` and reports the peak GPU memory of
  training and of validation apart;
* a ``torchrun --standalone`` run (default, --fp16, --torchrun-updates
  updates) with 2 processes where the machine has 2 GPUs, else 1 (the table
  says which); ``fairseq-generate --fp16`` (beam 5) on the first fp16
  default's checkpoint_best.pt, printing fairseq's BLEU line. Both come with
  fp16 (fp32 with --smoke) in --precisions, right after its trainings.

The tools are found however they were installed (fairseq_natbias.pipeline.
tool: the script beside this Python, else ``python -m``); a command that
cannot start or fails is one line in the table.

It writes WORKDIR/gpu_check.md and WORKDIR/results.json after every step
(and copies them, with the logs as logs.tar.gz, to --copy-to DIR); the
targets are explained in research/gpu_check_report.py. A finished step is
kept and not run again (a run whose options changed is run again); an
interrupted one starts again from scratch, because a resumed run's timing and
peak memory would not compare with an uninterrupted one's. --time-budget S
leaves out the runs that would end after S seconds (their rows say so). The
exit status is 1 when a step failed or was left out.

The data must be on the machine (GPU machines may have no internet):
--multi30k DIR, else $NATBIAS_MULTI30K, else ../shared/data/multi30k.
Without a CUDA GPU the script stops in one line, unless given --smoke: a CPU
run of the same steps with a tiny model, fp32 only, 2 updates, default and
stock once (--rounds 0), torchrun with one process, fairseq-generate on the
CPU (what tests/test_gpu_check.py runs).
"""

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "paper"))  # make demo's pipeline
sys.path.insert(0, str(HERE))

import gpu_check_report as report  # noqa: E402
import multi30k as data_fetch  # noqa: E402
import pipeline  # noqa: E402

from fairseq_natbias import plugin_dir  # noqa: E402
from natbias.tools import fairseq_logs  # noqa: E402

CHILD = HERE / "gpu_check_child.py"
ARMS = {
    "default": ["--arch", "transformer_natbias_iwslt_de_en"],
    "stock": ["--arch", "transformer"],
    "hookoff": ["--arch", "transformer_natbias_iwslt_de_en", "--no-natbias-logging"],
    "order2": ["--arch", "transformer_natbias_iwslt_de_en", "--natbias-order", "2"],
}
# The bigram residual (issue 39) is added to the logits in float32 whatever
# the model's precision: one run of it per half precision in which that
# matters (fp16's range, bf16's mantissa).
ORDER2_PRECISIONS = ("fp16", "bf16")
# The package's IWSLT preset, given to both arms so that stock builds the same
# network (the ratios compare like with like); fairseq's own
# transformer_iwslt_de_en is d 512, FFN 1024.
IWSLT_PRESET_SIZES = [
    "--encoder-layers",
    "6",
    "--decoder-layers",
    "6",
    "--encoder-embed-dim",
    "256",
    "--decoder-embed-dim",
    "256",
    "--encoder-ffn-embed-dim",
    "256",
    "--decoder-ffn-embed-dim",
    "256",
    "--encoder-attention-heads",
    "4",
    "--decoder-attention-heads",
    "4",
]
# Loss scaling that can fail: fp16's scale starts at 128 and grows after 2^14
# clean updates, AMP's (torch's GradScaler) after 2,000, so in 300 updates
# either could only fall. Both start at 65536 here, far above where the
# gradients fit, and try to grow every 25 clean updates. fairseq 0.12's
# AMPOptimizer takes its initial scale from --fp16-init-scale and, when
# --amp-scale-window is given at all, its growth interval from
# --amp-init-scale (fairseq/optim/amp_optimizer.py), hence the AMP options.
LOSS_SCALING = {
    "fp16": ["--fp16-init-scale", "65536", "--fp16-scale-window", "25"],
    "amp": ["--fp16-init-scale", "65536", "--amp-scale-window", "25", "--amp-init-scale", "25"],
}
PRECISIONS = {
    "fp32": [],
    "fp16": ["--fp16", *LOSS_SCALING["fp16"]],
    "bf16": ["--bf16"],
    "amp": ["--amp", *LOSS_SCALING["amp"]],
}
# The paper's optimiser and regularisation (sec. 4.1, as in the recipes) with
# a 100-update warm-up instead of 4,000: with 4,000 the learning rates of 300
# updates sum to 0.0057, so the gain (g moves about 20 learning rates per
# update) could not leave 0.05 for more than 0.16; with 100 they sum to 0.098.
SCHEDULE = [
    "--optimizer",
    "adam",
    "--adam-betas",
    "(0.9, 0.98)",
    "--lr",
    "5e-4",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "100",
    "--warmup-init-lr",
    "1e-07",
    "--criterion",
    "label_smoothed_cross_entropy",
    "--label-smoothing",
    "0.1",
    "--dropout",
    "0.3",
    "--weight-decay",
    "0.0001",
    "--max-tokens",
    "4096",
]
TINY_MODEL = [
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
]
LOG_INTERVAL = report.LOG_INTERVAL


def say(message):
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- checks before any work ------------------------------------------------------


def require_gpu(smoke):
    """Stop in one line on a machine without CUDA, unless this is the smoke run."""
    import torch

    if not smoke and not torch.cuda.is_available():
        raise SystemExit(
            f"gpu_check: no CUDA GPU: torch {torch.__version__} sees none; run this "
            "on a machine with a CUDA GPU, or add --smoke for the CPU smoke run"
        )


def raw_data(folder):
    """The Multi30k folder, checked here: there is no download to fall back on."""
    try:
        data_fetch.check_folder(folder, data_fetch.LANGS, "--multi30k")
    except data_fetch.DataError as error:
        raise SystemExit(f"gpu_check: {error} (or set NATBIAS_MULTI30K)") from None
    return Path(folder)


# --- the plan -----------------------------------------------------------------------------


def plan(precisions, rounds):
    """(name, precision, arm, index) of each training: per precision the arms
    alternate default, stock, stock, default (``rounds`` times; 0: default,
    stock once, as --smoke does), then one default run without the logging
    hook and, at fp16 and bf16, one with ``--natbias-order 2``."""
    runs = []
    for precision in precisions:
        count = {"default": 0, "stock": 0}
        for order in [("default", "stock", "stock", "default")] * rounds or [("default", "stock")]:
            for arm in order:
                count[arm] += 1
                runs.append((f"{precision} {arm} {count[arm]}", precision, arm, count[arm]))
        runs.append((f"{precision} hookoff 1", precision, "hookoff", 1))
        if precision in ORDER2_PRECISIONS:
            runs.append((f"{precision} order2 1", precision, "order2", 1))
    return runs


def generated_precision(smoke):
    """The precision of the default run whose checkpoint fairseq-generate
    reads and the torchrun run uses."""
    return "fp32" if smoke else "fp16"


def training_arguments(data_bin, run_dir, arm, precision, max_update, smoke, keep_checkpoint):
    """fairseq-train's arguments for one run."""
    options = [
        *ARMS[arm],
        "--share-all-embeddings",
        *PRECISIONS[precision],
        *SCHEDULE,
        "--seed",
        "1",
        "--log-format",
        "simple",
        "--no-progress-bar",
        "--log-interval",
        "1" if smoke else str(LOG_INTERVAL),
    ]
    options += ["--cpu", "--num-workers", "0", *TINY_MODEL] if smoke else IWSLT_PRESET_SIZES
    # Only the checkpoint that fairseq-generate reads is written: an IWSLT
    # checkpoint with Adam's state is about half a GiB.
    options += (
        ["--no-epoch-checkpoints", "--no-last-checkpoints"] if keep_checkpoint else ["--no-save"]
    )
    arguments = pipeline.train_command(data_bin, run_dir, options, max_update)
    # Absolute, so that the child finds the plugin from any working directory.
    arguments[arguments.index("--user-dir") + 1] = plugin_dir()
    return [str(a) for a in arguments]


LAUNCHERS = {
    # One process, so that it is the one whose peak memory is read.
    "python": lambda arguments, processes: [
        sys.executable,
        str(CHILD),
        json.dumps([*arguments, "--distributed-world-size", "1"]),
    ],
    # --standalone: a rendezvous on a free local port, none to set up.
    "torchrun": lambda arguments, processes: [
        *pipeline.tool("torchrun"),
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "fairseq_cli.train",
        *arguments,
        "--distributed-world-size",
        str(processes),
    ],
}


def launch(command, log_path, on_line=None):
    """pipeline.run, with a failure, or a command that cannot start, as the
    line that says why (None when it succeeded) and the output's lines."""
    lines = []

    def keep(line):
        lines.append(line.rstrip("\n"))
        if on_line:
            on_line(lines[-1])

    try:
        pipeline.run(command, log_path=log_path, on_line=keep)
    except SystemExit:  # pipeline.run's way of saying the command failed
        return report.error_line(lines), lines
    except OSError as error:  # it did not start: no such file, not executable
        return f"could not start {command[0]}: {error}", lines
    return None, lines


# --- the runs ------------------------------------------------------------------------


def train(name, launcher, arguments, run_dir, steps, max_update, processes=1):
    """One training (fairseq-train ``arguments`` started by ``launcher``), or
    its result from an earlier invocation with the same arguments; a failed
    run is recorded with its error line, and tried again next time."""
    earlier = steps.results.get(name)
    if (
        earlier
        and "failed" not in earlier
        and "left_out" not in earlier
        and earlier.get("launcher") == launcher
        and earlier.get("arguments") == arguments
    ):
        say(f"{name}: finished before, skipped")
        return earlier
    record = {"launcher": launcher, "arguments": arguments}
    why = steps.over_budget()
    if why:
        say(f"{name}: left out, {why}")
        steps.done(name, dict(record, left_out=why), 0.0)
        return steps.results[name]
    if run_dir.exists():  # an interrupted or failed attempt, or other options
        say(f"{name}: removing the earlier attempt in {run_dir}; starting from scratch")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    say(f"{name}: {max_update} updates with {launcher} (log: {run_dir / 'train.log'})")
    times, started = [], time.monotonic()

    def on_line(line):
        times.append(time.monotonic())  # when the line arrived: seconds per update
        report_progress(name, line, max_update)

    failed, lines = launch(
        LAUNCHERS[launcher](arguments, processes), run_dir / "train.log", on_line
    )
    if failed:
        record["failed"] = failed
        say(f"{name}: FAILED: {failed}")
    else:
        record.update(report.summarise_log(lines, times))
        record.update(report.child_report(lines))
        say(
            f"{name}: done, {report.number(record['seconds_per_update'], '{:.4f}')} s/update, "
            f"{record['overflow_steps']} overflow steps"
        )
    if launcher == "torchrun":
        record["processes"] = processes
        record["ranks"] = sorted(
            {int(m[1]) for line in lines for m in [TORCHRUN_RANK.search(line)] if m}
        )
    record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    record["seconds"] = round(time.monotonic() - started, 1)
    steps.done(name, record, record["seconds"])
    return record


# fairseq's distributed_init logs this once per rank that joined the process group.
TORCHRUN_RANK = re.compile(r"initialized host \S+ as rank (\d+)")


def report_progress(name, line, max_update):
    """A progress line every 50 updates, at each validation and each overflow."""
    if "overflow detected" in line:
        say(f"{name}: {line.split(' | ')[-1]}")
        return
    record = fairseq_logs.parse_line(line)
    if record is None or record.num_updates is None:
        return
    if record.tag == fairseq_logs.VALID:
        say(f"{name}: update {record.num_updates}, valid loss {record.values.get('loss')}")
    elif record.tag == fairseq_logs.TRAIN_INNER and (
        record.num_updates % 50 == 0 or record.num_updates == max_update
    ):
        scale = record.values.get("loss_scale")
        say(
            f"{name}: update {record.num_updates}/{max_update}, loss {record.values.get('loss')}"
            + (f", loss scale {scale:g}" if scale is not None else "")
        )


def generate(data_bin, checkpoint, run_dir, steps, smoke, trained):
    """fairseq-generate on ``checkpoint`` (beam 5), its BLEU line kept; done
    again when the training it reads was (``trained``: its finishing time)."""
    earlier = steps.results.get("generate")
    if earlier and earlier.get("checkpoint_trained") == trained and "failed" not in earlier:
        say("generate: finished before, skipped")
        return earlier
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"generate: beam 5 on the test set, {checkpoint}")
    arguments = [
        str(data_bin),
        "--user-dir",
        plugin_dir(),
        "--path",
        str(checkpoint),
        "--gen-subset",
        "test",
        "--beam",
        "5",
        "--remove-bpe",
        "sentencepiece",
        "--batch-size",
        "128",
        # An undertrained model rambles until fairseq's 200-token limit.
        "--max-len-a",
        "1.2",
        "--max-len-b",
        "10",
        *(["--cpu"] if smoke else ["--fp16"]),
    ]
    record = {"checkpoint_trained": trained, "command": arguments}
    log = run_dir / "generate.log"
    log.unlink(missing_ok=True)
    started = time.monotonic()
    try:
        command = [*pipeline.tool("fairseq-generate"), *arguments]
    except OSError as error:
        failed, lines = f"could not find fairseq-generate: {error}", []
    else:
        failed, lines = launch(command, log)
    if failed:
        record["failed"] = failed
    else:
        record["bleu_line"] = report.bleu_line(lines)
    steps.done("generate", record, time.monotonic() - started)
    return record


# --- the table's text around the figures -----------------------------------------------


def header(args):
    data = f"{args.data} (prepared before)" if args.data else "prepared in WORKDIR/data"
    sizes = " ".join(TINY_MODEL) if args.smoke else " ".join(IWSLT_PRESET_SIZES)
    return [
        f"- data: Multi30k De-En, joint SentencePiece ({args.vocab_size} pieces), "
        f"fairseq-preprocess --joined-dictionary; {data}",
        f"- default `{' '.join(ARMS['default'])}`, stock `{' '.join(ARMS['stock'])}`, "
        f"hook off `{' '.join(ARMS['hookoff'])}`; all `{sizes} --share-all-embeddings`",
        f"- {args.max_update} updates, `{' '.join(SCHEDULE)} --seed 1`; per precision "
        + (f"default, stock, stock, default ({args.rounds}x)" if args.rounds else "default, stock")
        + ", then hook off",
        "- loss scaling: fp16 `"
        + " ".join(LOSS_SCALING["fp16"])
        + "`, amp `"
        + " ".join(LOSS_SCALING["amp"])
        + "` (growth interval 25: fairseq takes it from "
        "--amp-init-scale)",
        f"- command: `{' '.join(['python', 'research/gpu_check.py', *args.argv])}`",
    ]


# --- main ---------------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--multi30k",
        default=os.environ.get("NATBIAS_MULTI30K", "../shared/data/multi30k"),
        help="folder of Multi30k's raw files (default: $NATBIAS_MULTI30K, else %(default)s)",
    )
    parser.add_argument("--workdir", default="work/gpu_check")
    parser.add_argument(
        "--data",
        help="the prepared data's folder (SentencePiece, "
        "data-bin): reused as it is, prepared there if absent "
        "(default: WORKDIR/data)",
    )
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="prepare the data (--data) and stop; needs no GPU",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=list(PRECISIONS),
        default=list(PRECISIONS),
        metavar="P",
        help="which of fp32 fp16 bf16 amp (default: all; --smoke: fp32)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="rounds of default, stock, stock, default per precision "
        "(default: 1; 0, --smoke's default: default, stock once)",
    )
    parser.add_argument(
        "--max-update", type=int, help="updates per run (default: 300; 2 with --smoke)"
    )
    parser.add_argument("--torchrun-updates", type=int, help="(default: 50; 2 with --smoke)")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=8000,
        help="SentencePiece pieces (default: %(default)s); prepared data is reused as it is",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        metavar="SECONDS",
        help="leave out the steps that would end after SECONDS (counted "
        "from the start; a step's length guessed as the longest so far)",
    )
    parser.add_argument(
        "--copy-to",
        metavar="DIR",
        help="after every step, copy the table, results.json and the logs (logs.tar.gz) here too",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU run of the script itself: tiny model, fp32, 2 updates",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.precisions = ["fp32"]
    args.rounds = args.rounds if args.rounds is not None else (0 if args.smoke else 1)
    args.max_update = args.max_update or (2 if args.smoke else 300)
    args.torchrun_updates = args.torchrun_updates or (2 if args.smoke else 50)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def torchrun_processes(smoke):
    """2 where the machine has 2 GPUs or more, else 1 (on the CPU: 1)."""
    import torch

    return 1 if smoke else min(2, max(1, torch.cuda.device_count()))


def run_all(args, data_bin, work, steps):
    """Every training of the plan, the torchrun run and fairseq-generate;
    name -> record. Each step's result is saved as it ends. The torchrun run
    and fairseq-generate follow the fp16 runs directly, so that a time
    budget leaves out later precisions' runs rather than them."""
    done, precision = {}, generated_precision(args.smoke)
    runs = plan(args.precisions, args.rounds)
    # the name of the generated precision's last training (None if absent)
    last_of_precision = next((name for name, p, *_ in reversed(runs) if p == precision), None)
    for name, run_precision, arm, index in runs:
        run_dir = work / "runs" / f"{run_precision}-{arm}-{index}"
        keep = (run_precision, arm, index) == (precision, "default", 1)
        arguments = training_arguments(
            data_bin, run_dir, arm, run_precision, args.max_update, args.smoke, keep
        )
        done[name] = train(name, "python", arguments, run_dir, steps, args.max_update)
        if name == last_of_precision:
            torchrun_and_generate(args, precision, data_bin, work, steps, done)
    return done


def torchrun_and_generate(args, precision, data_bin, work, steps, done):
    """The torchrun run (default, ``precision``) and fairseq-generate on the
    first default run of ``precision``; their records go into ``done``."""
    run_dir = work / "runs" / f"torchrun-{precision}-default"
    arguments = training_arguments(
        data_bin, run_dir, "default", precision, args.torchrun_updates, args.smoke, False
    )
    done["torchrun"] = train(
        "torchrun",
        "torchrun",
        arguments,
        run_dir,
        steps,
        args.torchrun_updates,
        torchrun_processes(args.smoke),
    )
    source = done[f"{precision} default 1"]
    if "failed" in source or "left_out" in source:
        return
    if steps.over_budget():
        steps.done("generate", {"left_out": steps.over_budget()}, 0.0)
    else:
        checkpoint = work / "runs" / f"{precision}-default-1" / "checkpoint_best.pt"
        done["generate"] = generate(
            data_bin, checkpoint, work / "generate", steps, args.smoke, source["finished"]
        )
        say(f"generate: {done['generate'].get('bleu_line') or 'FAILED'}")


def table(args, results):
    precision = generated_precision(args.smoke)
    source = results.get(f"{precision} default 1")
    generated = results.get("generate")
    why_not = (
        f"{precision} is not in --precisions"
        if precision not in args.precisions
        else "its training has not finished"
        if source is None or "failed" in source or "left_out" in source
        else (generated or {}).get("left_out", "not yet")
    )
    if generated and "left_out" in generated:
        generated = None
    ran = precision in args.precisions
    extra = [
        report.torchrun_line(
            results.get("torchrun") if ran else None,
            args.torchrun_updates,
            precision,
            "not yet" if ran else f"{precision} is not in --precisions",
        ),
        "",
        report.generate_line(generated, precision, why_not),
        "",
        report.HOW_MEASURED,
    ]
    if "bf16" in args.precisions:
        extra += ["", report.BF16_NOTE]
    if args.smoke:
        extra += [
            "",
            "fp16, bf16, amp: skipped (--smoke runs on the CPU, where fairseq's "
            "half-precision training needs CUDA)",
        ]
    return report.markdown(
        plan(args.precisions, args.rounds), results, header(args), extra, args.smoke
    )


def prepare(args, raw, work):
    folder = Path(args.data).resolve() if args.data else work / "data"
    try:
        return pipeline.prepare(raw, folder, args.vocab_size)
    except OSError as error:  # fairseq-preprocess could not start
        raise SystemExit(f"gpu_check: preparing the data failed: {error}") from None


def main(argv=None):
    args = parse_args(argv)
    raw = raw_data(args.multi30k)
    if args.prepare_only:
        if not args.data:
            raise SystemExit("gpu_check: --prepare-only needs --data DIR")
        say(f"data ready in {prepare(args, raw, None)}")
        return
    require_gpu(args.smoke)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONUNBUFFERED"] = "1"  # the children's lines arrive as written: timing
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    steps = report.Steps(
        work, results, args.time_budget, args.copy_to, lambda results: table(args, results)
    )
    data_bin = prepare(args, raw, work)
    done = run_all(args, data_bin, work, steps)
    print("\n" + steps.save())
    say(
        f"table in {work / 'gpu_check.md'}, results in {results_path}"
        + (f", copied to {args.copy_to}" if args.copy_to else "")
    )
    failed = [name for name, record in done.items() if "failed" in record]
    names = [name for name, *_ in plan(args.precisions, args.rounds)] + ["torchrun", "generate"]
    left_out = [name for name in names if "left_out" in results.get(name, {})]
    if failed or left_out:
        raise SystemExit(
            f"gpu_check: failed: {', '.join(failed) or 'none'}; left out: "
            f"{', '.join(left_out) or 'none'}; see the logs in {work}/runs "
            f"and {work}/generate"
        )


if __name__ == "__main__":
    main()
