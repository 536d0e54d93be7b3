"""Issue 18's GPU check in one command: does the default train under half
precision as stock fairseq does, at the IWSLT preset, on a CUDA GPU?

    .venv/bin/python benchmarks/gpu_check.py --workdir work/gpu_check

What it runs (through the real fairseq; Multi30k De-En, joint SentencePiece
8k, fairseq-preprocess --joined-dictionary, as fairseq_natbias/pipeline.py
prepares it for the demo and the study):

* ``--arch transformer_natbias_iwslt_de_en`` (the default) and stock
  ``--arch transformer`` given the preset's sizes (6+6 layers, d 256, FFN
  256, 4 heads: the same network; fairseq's own ``transformer_iwslt_de_en``
  is d 512, FFN 1024), both ``--share-all-embeddings``, the
  paper's schedule, --max-update updates (300) in fp32 (reference) and with
  each of ``--fp16``, ``--bf16``, ``--amp``; each training in a child
  ``python -c`` that calls ``fairseq_cli.train.cli_main()`` and then prints
  ``torch.cuda.max_memory_allocated()`` (fairseq 0.12 makes --bf16 imply
  --tpu; the child undoes that, see CHILD);
* one ``torchrun --standalone --nproc_per_node=1 -m fairseq_cli.train`` run
  (default, --fp16, --torchrun-updates updates);
* ``fairseq-generate --fp16`` (beam 5, --remove-bpe sentencepiece) on the
  default's fp16 checkpoint_best.pt, printing fairseq's BLEU line.

It writes WORKDIR/gpu_check.md (and prints it): per run the loss-scale
trajectory, skipped updates, seconds per update, peak GPU memory and final
validation loss; per precision the ratios default/stock, with issue 18's
targets marked pass or FAIL. Each finished step is kept in
WORKDIR/results.json and not run again (a run whose options changed is run
again); a run that was interrupted starts again from scratch, because a
resumed run's timing and peak memory would not compare with an uninterrupted
one's. The exit status is 1 when a run failed (the table says which).

The data must be on the machine (GPU machines may have no internet):
--multi30k DIR, else $NATBIAS_MULTI30K, else ../shared/data/multi30k.
Without a CUDA GPU the script stops in one line, unless given --smoke: a CPU
run of the same steps with a tiny model, fp32 only, 2 updates, no torchrun,
fairseq-generate on the CPU (what tests/test_gpu_check.py runs).
"""

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairseq_natbias import data_fetch, pipeline, plugin_dir  # noqa: E402
from fairseq_natbias.analysis import fairseq_logs  # noqa: E402

ARMS = {"default": "transformer_natbias_iwslt_de_en", "stock": "transformer"}
# The package's IWSLT preset, given to both arms so that stock builds the same
# network (the ratios compare like with like).
IWSLT_PRESET_SIZES = [
    "--encoder-layers", "6", "--decoder-layers", "6",
    "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]
PRECISIONS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"], "amp": ["--amp"]}
# The paper's schedule (sec. 4.1), as in the recipes.
PAPER_SCHEDULE = [
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--warmup-init-lr", "1e-07",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--dropout", "0.3", "--weight-decay", "0.0001", "--max-tokens", "4096",
]
TINY_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]
LOG_INTERVAL = 10
LOSS_SCALE_AT = 200  # the update at which issue 18 compares loss scales
TARGET_LOSS_SCALE_FACTOR = 2.0  # default's loss scale within 2x of stock's
TARGET_RATIO = 1.02  # seconds per update and peak memory, default/stock
CHILD_MARK = "gpu_check child: "

# The training process: fairseq's own entry point, then the peak memory of
# this very process (which is why training must not be spawned elsewhere:
# --distributed-world-size 1 below). fairseq 0.12 turns --bf16 into --tpu
# when it parses the options (fairseq/options.py), and its TPU path needs
# torch_xla, so --bf16 cannot train on a GPU as it is: the parsed options get
# tpu back as the command line says (unset), for both arms alike.
CHILD = f"""\
import json, sys
from fairseq_cli.train import cli_main  # first: it sets up fairseq's log format
import fairseq.options
argv = json.loads(sys.argv[1])
sys.argv = ["fairseq-train", *argv]
parse = fairseq.options.parse_args_and_arch
def parse_without_implied_tpu(*args, **kwargs):
    parsed = parse(*args, **kwargs)
    parsed.tpu = "--tpu" in argv
    return parsed
fairseq.options.parse_args_and_arch = parse_without_implied_tpu
cli_main()
import fairseq, torch
on_gpu = torch.cuda.is_initialized()
print({CHILD_MARK!r} + json.dumps({{
    "device": torch.cuda.get_device_name() if on_gpu else None,
    "peak_memory_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
    "torch": torch.__version__, "fairseq": fairseq.__version__}}), flush=True)
"""


def say(message):
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- checks before any work ------------------------------------------------------


def require_gpu(smoke):
    """Stop in one line on a machine without CUDA, unless this is the smoke run."""
    import torch

    if not smoke and not torch.cuda.is_available():
        raise SystemExit(f"gpu_check: no CUDA GPU: torch {torch.__version__} sees none; run this "
                         "on a machine with a CUDA GPU, or add --smoke for the CPU smoke run")


def raw_data(folder):
    """The Multi30k folder, checked here: there is no download to fall back on."""
    try:
        data_fetch.check_folder(folder, data_fetch.LANGS, "--multi30k")
    except data_fetch.DataError as error:
        raise SystemExit(f"gpu_check: {error} (or set NATBIAS_MULTI30K)") from None
    return Path(folder)


# --- the runs ------------------------------------------------------------------------


def plan(smoke):
    """(precision, arm) of each training, the reference precision first."""
    precisions = ["fp32"] if smoke else list(PRECISIONS)
    return [(precision, arm) for precision in precisions for arm in ARMS]


def generated_precision(smoke):
    """The precision of the default run whose checkpoint fairseq-generate reads."""
    return "fp32" if smoke else "fp16"


def training_arguments(data_bin, run_dir, arm, precision, max_update, smoke, keep_checkpoint):
    """fairseq-train's arguments for one run."""
    options = ["--arch", ARMS[arm], "--share-all-embeddings", *PRECISIONS[precision],
               *PAPER_SCHEDULE, "--seed", "1", "--log-format", "simple", "--no-progress-bar",
               "--log-interval", "1" if smoke else str(LOG_INTERVAL)]
    options += ["--cpu", "--num-workers", "0", *TINY_MODEL] if smoke else IWSLT_PRESET_SIZES
    # Only the checkpoint that fairseq-generate reads is written: an IWSLT
    # checkpoint with Adam's state is about half a GiB.
    options += (["--no-epoch-checkpoints", "--no-last-checkpoints"] if keep_checkpoint
                else ["--no-save"])
    arguments = pipeline.train_command(data_bin, run_dir, options, max_update)
    # Absolute, so that the child finds the plugin from any working directory.
    arguments[arguments.index("--user-dir") + 1] = plugin_dir()
    return [str(a) for a in arguments]


LAUNCHERS = {
    # One process, so that it is the one whose peak memory is read.
    "python -c": lambda arguments: [sys.executable, "-c", CHILD,
                                    json.dumps([*arguments, "--distributed-world-size", "1"])],
    # --standalone: a rendezvous on a free local port, none to set up.
    "torchrun": lambda arguments: [pipeline.tool("torchrun"), "--standalone",
                                   "--nproc_per_node=1", "-m", "fairseq_cli.train", *arguments],
}


def train(name, launcher, arguments, run_dir, results, max_update):
    """One training (fairseq-train ``arguments`` started by ``launcher``), or
    its result from an earlier invocation with the same arguments; a failed
    run is recorded with its error line, and tried again next time."""
    earlier = results.get(name)
    if (earlier and "failed" not in earlier and earlier.get("launcher") == launcher
            and earlier.get("arguments") == arguments):
        say(f"{name}: finished before, skipped")
        return earlier
    if run_dir.exists():  # an interrupted or failed attempt, or other options
        say(f"{name}: removing the earlier attempt in {run_dir}; starting from scratch")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    say(f"{name}: {max_update} updates with {launcher} (log: {run_dir / 'train.log'})")
    lines, times = [], []

    def on_line(line):
        times.append(time.monotonic())  # when the line arrived: seconds per update
        lines.append(line.rstrip("\n"))
        report_progress(name, lines[-1], max_update)

    record = {"launcher": launcher, "arguments": arguments}
    try:
        pipeline.run(LAUNCHERS[launcher](arguments), log_path=run_dir / "train.log",
                     on_line=on_line)
    except SystemExit as error:  # pipeline.run's way of saying the command failed
        record["failed"] = last_line(str(error))
        say(f"{name}: FAILED: {record['failed']}")
    else:
        record.update(summarise_log(lines, times))
        record.update(child_report(lines))
        say(f"{name}: done, {number(record['seconds_per_update'], '{:.4f}')} s/update, "
            f"{record['skipped_updates']} skipped updates")
    record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    results[name] = record
    return record


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
            record.num_updates % 50 == 0 or record.num_updates == max_update):
        scale = record.values.get("loss_scale")
        say(f"{name}: update {record.num_updates}/{max_update}, loss {record.values.get('loss')}"
            + (f", loss scale {scale:g}" if scale is not None else ""))


def last_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def generate(data_bin, checkpoint, run_dir, results, smoke, trained):
    """fairseq-generate on ``checkpoint`` (beam 5), its BLEU line kept; done
    again when the training it reads was (``trained``: its finishing time)."""
    earlier = results.get("generate")
    if earlier and earlier.get("checkpoint_trained") == trained and "failed" not in earlier:
        say("generate: finished before, skipped")
        return earlier
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"generate: beam 5 on the test set, {checkpoint}")
    command = [pipeline.tool("fairseq-generate"), str(data_bin), "--user-dir", plugin_dir(),
               "--path", str(checkpoint), "--gen-subset", "test", "--beam", "5",
               "--remove-bpe", "sentencepiece", "--batch-size", "128",
               # An undertrained model rambles until fairseq's 200-token limit.
               "--max-len-a", "1.2", "--max-len-b", "10",
               *(["--cpu"] if smoke else ["--fp16"])]
    record = {"checkpoint_trained": trained, "command": command[1:]}
    log = run_dir / "generate.log"
    log.unlink(missing_ok=True)
    try:
        output = pipeline.run(command, log_path=log)
    except SystemExit as error:
        record["failed"] = last_line(str(error))
    else:
        record["bleu_line"] = bleu_line(output.splitlines())
    results["generate"] = record
    return record


def bleu_line(lines):
    """fairseq-generate's "Generate test with beam=5: BLEU4 = ..." line, without
    the logging prefix."""
    found = [line[line.index("Generate "):] for line in lines
             if re.search(r"Generate .*BLEU", line)]
    return found[-1] if found else "no BLEU line in fairseq-generate's output"


# --- reading a training log ------------------------------------------------------------

# The notes fairseq 0.12 writes for a skipped update and the loss scale it
# moves to: FP16Optimizer's (--fp16) and AMPOptimizer's (--amp).
OVERFLOW_SCALE = (re.compile(r"gradient overflow detected.*setting loss scale to: ([-+.\deE]+)"),
                  re.compile(r"AMP: overflow detected, setting scale to to ([-+.\deE]+)"))


def inner_records(lines):
    """(line index, record) of each train_inner line (every --log-interval updates)."""
    records = ((i, fairseq_logs.parse_line(line)) for i, line in enumerate(lines))
    return [(i, r) for i, r in records if r is not None and r.tag == fairseq_logs.TRAIN_INNER]


def loss_scale_trajectory(lines, at=LOSS_SCALE_AT):
    """first, min, at update ``at`` and last loss scale, from the train_inner
    lines (the scale after their interval's last update) and the overflow notes
    (where it dips between two log lines); None without loss scaling."""
    logged = [(r.num_updates, r.values["loss_scale"]) for _, r in inner_records(lines)
              if "loss_scale" in r.values]
    if not logged:
        return None
    noted = [float(match[1]) for line in lines for pattern in OVERFLOW_SCALE
             for match in [pattern.search(line)] if match]
    return {"first": logged[0][1], "min": min([s for _, s in logged] + noted),
            "at": next((s for u, s in logged if u == at), None), "at_update": at,
            "last": logged[-1][1]}


def skipped_updates(lines):
    """Optimizer steps dropped for an inf/nan gradient: fairseq notes each one
    ("NOTE: gradient overflow detected ..." under --fp16, "AMP: overflow
    detected ..." under --amp) and does not count it as an update."""
    return sum("overflow detected" in line for line in lines)


def seconds_per_update(lines, times):
    """Wall time per update between consecutive train_inner lines as they
    arrived (``times``), and the number of updates timed. Intervals holding an
    epoch's end (validation, checkpoint, new batches: its lines mention the
    epoch) are left out, and so is everything before the first line (start-up,
    CUDA warm-up)."""
    marks = inner_records(lines)
    seconds = updates = 0
    for (i0, r0), (i1, r1) in zip(marks, marks[1:]):
        if any("epoch" in line for line in lines[i0 + 1:i1]):
            continue
        seconds += times[i1] - times[i0]
        updates += r1.num_updates - r0.num_updates
    return (seconds / updates if updates else None), updates


def summarise_log(lines, times):
    records = fairseq_logs.parse_lines(lines)
    valid = [r for r in records if r.tag == fairseq_logs.VALID]
    updates = [r.num_updates for r in records if r.num_updates is not None]
    per_update, timed = seconds_per_update(lines, times)
    return {"updates": max(updates) if updates else 0,
            "loss_scale": loss_scale_trajectory(lines),
            "skipped_updates": skipped_updates(lines),
            "seconds_per_update": round(per_update, 6) if per_update is not None else None,
            "timed_updates": timed,
            "final_valid_loss": valid[-1].values.get("loss") if valid else None}


def child_report(lines):
    """What the child printed after training: device, peak memory, versions."""
    found = [json.loads(line[len(CHILD_MARK):]) for line in lines if line.startswith(CHILD_MARK)]
    return found[-1] if found else {}


# --- the table --------------------------------------------------------------------------


def number(value, form="{:g}"):
    return "—" if value is None else form.format(value)


def run_row(precision, arm, record, smoke):
    if record is None or "failed" in record:
        why = record["failed"] if record else "not run"
        return f"| {precision} | {arm} | FAILED: {why} |" + " |" * 9
    scale = record["loss_scale"] or {}
    device = "CPU smoke" if smoke else (record.get("device") or "CPU")
    memory = record.get("peak_memory_bytes")
    cells = [precision, arm, device, str(record["updates"]),
             number(scale.get("first")), number(scale.get("min")), number(scale.get("at")),
             number(scale.get("last")), str(record["skipped_updates"]),
             number(record["seconds_per_update"], "{:.4f}"),
             "n/a (CPU)" if memory is None else f"{memory / 2**20:.0f}",
             number(record["final_valid_loss"], "{:.3f}")]
    return "| " + " | ".join(cells) + " |"


def ratio_cell(default, stock, target):
    if default is None or stock is None or not stock:
        return "—"
    ratio = default / stock
    return f"{ratio:.3f} {'pass' if ratio <= target else 'FAIL'}"


def loss_scale_cell(default, stock):
    scales = [record.get("loss_scale") for record in (default, stock)]
    if None in scales:
        return "n/a (no loss scaling)"  # fp32 and bf16
    at_default, at_stock = (scale["at"] for scale in scales)
    if at_default is None or at_stock is None:
        return f"n/a (no log line at update {LOSS_SCALE_AT})"
    factor = TARGET_LOSS_SCALE_FACTOR
    ok = at_stock / factor <= at_default <= at_stock * factor
    return f"{at_default:g} vs {at_stock:g}: {'pass' if ok else 'FAIL'}"


def target_row(precision, default, stock):
    good = [r for r in (default, stock) if r and "failed" not in r]
    if len(good) < 2:
        return f"| {precision} | — | — | — (a run failed) |"
    seconds, memory = (
        ratio_cell(default.get(key), stock.get(key), TARGET_RATIO)
        for key in ("seconds_per_update", "peak_memory_bytes"))
    return f"| {precision} | {loss_scale_cell(default, stock)} | {seconds} | {memory} |"


def versions(records):
    def named(key):
        return ", ".join(sorted({str(r[key]) for r in records if r.get(key)})) or "—"
    return named("device"), named("torch"), named("fairseq")


def markdown(runs, results, args, extra):
    """The report: settings, one row per run, the targets, torchrun and generate."""
    records = [results.get(f"{p} {a}") for p, a in runs]
    device, torch_version, fairseq_version = versions([r for r in records if r])
    if args.smoke:
        device = "CPU smoke (no GPU: these figures test the script, not the package)"
    precisions = list(dict.fromkeys(p for p, _ in runs))
    lines = [
        "# GPU check (issue 18): the default against stock fairseq in half precision", "",
        f"- device: {device}; torch {torch_version}; fairseq {fairseq_version}",
        f"- data: Multi30k De-En, joint SentencePiece ({args.vocab_size} pieces), "
        "fairseq-preprocess --joined-dictionary",
        f"- default `--arch {ARMS['default']}`, stock `--arch {ARMS['stock']}`, both "
        f"`{' '.join(IWSLT_PRESET_SIZES)} --share-all-embeddings`" + (f"; smoke: `{' '.join(TINY_MODEL)}`" if args.smoke else ""),
        f"- {args.max_update} updates, `{' '.join(PAPER_SCHEDULE)} --seed 1`",
        f"- command: `{' '.join(['python', 'benchmarks/gpu_check.py', *args.argv])}`", "",
        "| precision | arm | device | updates | loss scale: first | min | "
        f"at update {LOSS_SCALE_AT} | last | skipped updates | s/update | "
        "peak GPU memory (MiB) | final valid loss |",
        "|---" * 12 + "|",
        *(run_row(p, a, r, args.smoke) for (p, a), r in zip(runs, records)), "",
        f"Targets, default against stock: loss scale at update {LOSS_SCALE_AT} within "
        f"{TARGET_LOSS_SCALE_FACTOR:g}x, s/update and peak memory ratios <= {TARGET_RATIO}.", "",
        f"| precision | loss scale at update {LOSS_SCALE_AT}, default vs stock | "
        "s/update, default/stock | peak GPU memory, default/stock |",
        "|---|---|---|---|",
        *(target_row(p, results.get(f"{p} default"), results.get(f"{p} stock"))
          for p in precisions), "",
        *extra, "",
        "How measured: loss scale from fairseq's train_inner lines (--log-interval "
        f"{1 if args.smoke else LOG_INTERVAL}; the min also from its overflow notes); "
        "skipped updates = fairseq's overflow notes; s/update = wall time between "
        "consecutive train_inner lines as they arrived, over the intervals without an "
        "epoch's end (validation, checkpoint) and after the first line (fairseq's own "
        "train_wall is rounded to whole seconds); peak memory = "
        "torch.cuda.max_memory_allocated() in the training process, validation included; "
        "valid loss = label-smoothed loss in bits at the last validation.",
    ]
    if "bf16" in precisions:
        lines += ["", "bf16: fairseq 0.12's --bf16 implies --tpu, whose code needs torch_xla; "
                      "the training process undoes that one implication (for both arms), or "
                      "--bf16 could not train on a GPU at all."]
    return "\n".join(lines) + "\n"


def torchrun_line(record, updates):
    if record is None:
        return "torchrun --nproc_per_node=1: skipped (--smoke)"
    if "failed" in record:
        return f"torchrun --nproc_per_node=1 (default, --fp16): FAILED: {record['failed']}"
    scale = record["loss_scale"] or {}
    return (f"torchrun --nproc_per_node=1 (default, --fp16, {updates} updates): reached update "
            f"{record['updates']}, loss scale {number(scale.get('last'))}, "
            f"{record['skipped_updates']} skipped updates, "
            f"{number(record['seconds_per_update'], '{:.4f}')} s/update, valid loss "
            f"{number(record['final_valid_loss'], '{:.3f}')}")


def generate_line(record, smoke):
    where = "--cpu, on the fp32 default's" if smoke else "--fp16, on the fp16 default's"
    if record is None:
        return f"fairseq-generate ({where} checkpoint): not run, its training failed"
    result = f"FAILED: {record['failed']}" if "failed" in record else f"`{record['bleu_line']}`"
    return f"fairseq-generate (beam 5, {where} checkpoint_best.pt): {result}"


# --- main ---------------------------------------------------------------------------------


def load_results(path):
    return json.loads(path.read_text()) if path.exists() else {}


def save_results(path, results):
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(results, indent=1))
    partial.replace(path)  # whole or not at all, should the script be stopped here


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", default=os.environ.get("NATBIAS_MULTI30K",
                                                             data_fetch.LOCAL_MULTI30K),
                        help="folder of Multi30k's raw files (default: $NATBIAS_MULTI30K, "
                             "else %(default)s)")
    parser.add_argument("--workdir", default="work/gpu_check")
    parser.add_argument("--max-update", type=int, help="updates per run (default: 300; 2 "
                                                       "with --smoke)")
    parser.add_argument("--torchrun-updates", type=int, default=50)
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="SentencePiece pieces (default: %(default)s); the data "
                             "prepared in WORKDIR/data is reused as it is")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU run of the script itself: tiny model, fp32, 2 updates")
    args = parser.parse_args(argv)
    args.max_update = args.max_update or (2 if args.smoke else 300)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def train_all(args, data_bin, work, results, results_path):
    """Every training of the plan, then the torchrun run; name -> record."""
    done = {}
    for precision, arm in plan(args.smoke):
        name, run_dir = f"{precision} {arm}", work / "runs" / f"{precision}-{arm}"
        keep = precision == generated_precision(args.smoke)
        arguments = training_arguments(data_bin, run_dir, arm, precision, args.max_update,
                                       args.smoke, keep)
        done[name] = train(name, "python -c", arguments, run_dir, results, args.max_update)
        save_results(results_path, results)  # after each run: an interruption loses one
    if not args.smoke:
        run_dir = work / "runs" / "torchrun-fp16-default"
        arguments = training_arguments(data_bin, run_dir, "default", "fp16",
                                       args.torchrun_updates, False, False)
        done["torchrun"] = train("torchrun fp16 default", "torchrun", arguments, run_dir,
                                 results, args.torchrun_updates)
        save_results(results_path, results)
    return done


def main(argv=None):
    args = parse_args(argv)
    require_gpu(args.smoke)
    raw = raw_data(args.multi30k)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONUNBUFFERED"] = "1"  # the children's lines arrive as written: timing
    results_path = work / "results.json"
    results = load_results(results_path)
    data_bin = pipeline.prepare(raw, work / "data", args.vocab_size)
    done = train_all(args, data_bin, work, results, results_path)

    precision = generated_precision(args.smoke)
    source = done[f"{precision} default"]
    if "failed" not in source:
        checkpoint = work / "runs" / f"{precision}-default" / "checkpoint_best.pt"
        done["generate"] = generate(data_bin, checkpoint, work / "generate", results,
                                    args.smoke, source["finished"])
        save_results(results_path, results)
        say(f"generate: {done['generate'].get('bleu_line') or 'FAILED'}")

    extra = [torchrun_line(done.get("torchrun"), args.torchrun_updates), "",
             generate_line(done.get("generate"), args.smoke)]
    if args.smoke:
        extra += ["", "fp16, bf16, amp: skipped (--smoke runs on the CPU, where fairseq's "
                      "half-precision training needs CUDA)"]
    table = markdown(plan(args.smoke), results, args, extra)
    (work / "gpu_check.md").write_text(table)
    print("\n" + table)
    say(f"table in {work / 'gpu_check.md'}, results in {results_path}")
    failed = [name for name, record in done.items() if "failed" in record]
    if failed:
        raise SystemExit(f"gpu_check: failed: {', '.join(failed)}; see the logs in {work}/runs "
                         f"and {work}/generate")


if __name__ == "__main__":
    main()
