"""Issue 18's GPU check, behind docs/results.md's "Half precision"
(results/gpu_check_h100.md): does the default train under half precision as
stock fairseq does? How to run it on a lent GPU: research/studies/gpu_check.md.

    python research/gpu_check.py --multi30k DIR --workdir work/gpu_check

The default (``--arch transformer_natbias_iwslt_de_en``) and stock ``--arch
transformer`` at the registered preset's sizes train through the real fairseq
on Multi30k De-En (SentencePiece 8k), a 100-update warm-up, in fp32, --fp16,
--bf16 and --amp: per precision default, stock, stock, default (--rounds times;
0: default, stock), then the default with --no-natbias-logging (the hook's
share). fp16 and amp start at loss scale 65536 and try to grow every 25 clean
updates. Each training is a child (this script with --child) that reports the
peak GPU memory of training and of validation apart. After fp16's: torchrun, and
fairseq-generate --fp16 on the first default's checkpoint. WORKDIR/gpu_check.md
and results.json follow every step (and --copy-to, so that a call stopped at its
limit keeps them); a step finished with the same options is skipped. Without
CUDA it stops in one line, unless --smoke (tiny, CPU, fp32, 2 updates).
Targets, default against stock: loss scale minimum and final level (the highest
scale of the last FINAL_WINDOW updates) >= stock's, overflow steps <= stock's,
training peak <= TARGET_RATIO; s/update (median 1/ups) and the rest: no target.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "paper"))  # make demo's pipeline

import multi30k as data_fetch
import pipeline

from natbias.tools import fairseq_logs

PRESET = "transformer_natbias_iwslt_de_en"
ARMS = {"default": ["--arch", PRESET], "stock": ["--arch", "transformer"]}
ARMS["hookoff"] = [*ARMS["default"], "--no-natbias-logging"]
# By default fp16's scale starts at 128 and AMP's grows after 2,000 clean updates: in
# 300 updates either could only fall. fairseq 0.12's AMP takes its growth from --amp-init-scale.
LOSS_SCALING = {
    "fp16": "--fp16-init-scale 65536 --fp16-scale-window 25".split(),
    "amp": "--fp16-init-scale 65536 --amp-scale-window 25 --amp-init-scale 25".split(),
}
PRECISIONS = {"fp32": [], "fp16": ["--fp16", *LOSS_SCALING["fp16"]], "bf16": ["--bf16"]}
PRECISIONS["amp"] = ["--amp", *LOSS_SCALING["amp"]]
SCHEDULE = [
    *"--optimizer adam --adam-betas".split(),
    "(0.9, 0.98)",
    *"--lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 100 --warmup-init-lr 1e-07".split(),
    *"--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.3".split(),
    *"--weight-decay 0.0001 --max-tokens 4096".split(),
]
SIZE_KEYS = ("layers", "embed_dim", "ffn_embed_dim", "attention_heads")
TINY = {"layers": 1, "embed_dim": 32, "ffn_embed_dim": 64, "attention_heads": 2}
TARGET_RATIO = 1.02  # training peak memory, default/stock
FINAL_WINDOW = 50  # updates at the end whose highest loss scale is the final level
CHILD_MARK = "gpu_check child: "


def say(message):
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def sizes(smoke):
    """Both arms' sizes as options: the registered preset's (--smoke: tiny ones)."""
    values = TINY
    if not smoke:
        from fairseq.models import ARCH_CONFIG_REGISTRY

        import fairseq_natbias  # noqa: F401  (registers the preset)

        preset = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[PRESET](preset)
        values = {key: getattr(preset, f"encoder_{key}") for key in SIZE_KEYS}
    keys = [(side, key) for side in ("encoder", "decoder") for key in SIZE_KEYS]
    return [f"--{side}-{key.replace('_', '-')}={values[key]}" for side, key in keys]


class PeakMemory:
    """Peak allocation by phase. fairseq 0.12's Trainer resets the peak after every
    update: it is folded into a running maximum before each reset, and validation
    (fairseq_cli.train.validate) kept apart."""

    def __init__(self, cuda):
        self.cuda, self.reset = cuda, cuda.reset_peak_memory_stats  # the real one, kept
        self.peaks, self.phase = {"train": 0, "valid": 0}, "train"

    def fold(self, phase=None):
        self.peaks[self.phase] = max(self.peaks[self.phase], int(self.cuda.max_memory_allocated()))
        self.phase = phase or self.phase

    def reset_peak_memory_stats(self, *args, **kwargs):
        self.fold()
        return self.reset(*args, **kwargs)

    def around_validation(self, validate):
        def validate_measured(*args, **kwargs):
            self.reset_peak_memory_stats()
            self.phase = "valid"
            try:
                return validate(*args, **kwargs)
            finally:
                self.fold("train")
                self.reset()

        return validate_measured

    def finish(self):
        self.fold()
        return dict(self.peaks)


def without_implied_tpu(parse, argv):
    """fairseq 0.12 turns --bf16 into --tpu (torch_xla): tpu as the command line says."""

    def parse_without_implied_tpu(*args, **kwargs):
        parsed = parse(*args, **kwargs)
        parsed.tpu = "--tpu" in argv
        return parsed

    return parse_without_implied_tpu


def child(arguments):
    import fairseq_cli.train  # isort: skip  (first: its import sets fairseq's log format)
    import fairseq
    import fairseq.options
    import torch

    argv = json.loads(arguments)
    sys.argv = ["fairseq-train", *argv]
    parse = fairseq.options.parse_args_and_arch
    fairseq.options.parse_args_and_arch = without_implied_tpu(parse, argv)
    memory = PeakMemory(torch.cuda) if torch.cuda.is_available() and "--cpu" not in argv else None
    if memory:
        torch.cuda.reset_peak_memory_stats = memory.reset_peak_memory_stats
        fairseq_cli.train.validate = memory.around_validation(fairseq_cli.train.validate)
    fairseq_cli.train.cli_main()
    peaks = memory.finish() if memory else {}
    report = {"device": torch.cuda.get_device_name() if memory else None}
    report.update(peak_train_bytes=peaks.get("train"), peak_valid_bytes=peaks.get("valid"))
    report.update(torch=torch.__version__, fairseq=fairseq.__version__)
    print(CHILD_MARK + json.dumps(report), flush=True)


# --- reading the logs ---------------------------------------------------------------------

# fairseq 0.12's notes of an overflowed step: FP16Optimizer's (the update is
# skipped) and AMPOptimizer's (the batch is tried again, then maybe dropped).
OVERFLOW_SCALE = re.compile(r"overflow detected.*setting (?:loss )?scale to(?: to)?:? ([-+.\deE]+)")
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b(:|$)")


def summarise_log(lines):
    """A training's figures from fairseq's lines and the child's report."""
    records = fairseq_logs.parse_lines(lines)
    inner = [r for r in records if r.tag == fairseq_logs.TRAIN_INNER]
    valid = [r.values for r in records if r.tag == fairseq_logs.VALID]
    logged = [(r.num_updates, r.values["loss_scale"]) for r in inner if "loss_scale" in r.values]
    notes = [float(m[1]) for line in lines for m in [OVERFLOW_SCALE.search(line)] if m]
    end = logged[-1][0] if logged else 0
    scale = logged and {
        "first": logged[0][1],
        "min": min([s for _, s in logged] + notes),
        "final_level": max(s for u, s in logged if u > end - FINAL_WINDOW),
        "last": logged[-1][1],
    }
    ups = [1 / r.values["ups"] for r in inner if r.values.get("ups")]
    gains = [r.values["gain"] for r in inner if "gain" in r.values]
    reports = [json.loads(line[len(CHILD_MARK) :]) for line in lines if line.startswith(CHILD_MARK)]
    return {
        "updates": max((r.num_updates for r in records if r.num_updates), default=0),
        "loss_scale": scale or None,
        "overflow_steps": sum("overflow detected" in line for line in lines),
        "gain": gains[-1] if gains else None,
        "seconds_per_update": round(statistics.median(ups), 6) if ups else None,
        "final_valid_loss": valid[-1].get("loss") if valid else None,
        **(reports[-1] if reports else {}),
    }


def error_line(lines):
    """The last exception line other than torchrun's banner, else the last line."""
    lines = [line.strip() for line in lines if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line) and "ChildFailedError" not in line]
    return errors[-1] if errors else (lines[-1] if lines else "no output")


def plan(precisions, rounds):
    """(name, precision, arm, index) of each training."""
    runs = []
    for precision in precisions:
        count = {"default": 0, "stock": 0}
        for order in [("default", "stock", "stock", "default")] * rounds or [("default", "stock")]:
            for arm in order:
                count[arm] += 1
                runs.append((f"{precision} {arm} {count[arm]}", precision, arm, count[arm]))
        runs.append((f"{precision} hookoff 1", precision, "hookoff", 1))
    return runs


def training_arguments(data_bin, run_dir, arm, precision, max_update, smoke, keep_checkpoint):
    from fairseq_natbias import plugin_dir

    options = [*ARMS[arm], "--share-all-embeddings", *PRECISIONS[precision], *SCHEDULE]
    options += ["--seed", "1", "--log-format", "simple", "--no-progress-bar", *sizes(smoke)]
    options += ["--log-interval", "1", "--cpu", "--num-workers", "0"] if smoke else []
    options += [] if smoke else ["--log-interval", "10"]
    # Only the checkpoint fairseq-generate reads is written (an IWSLT one: ~0.5 GiB).
    options += ["--no-epoch-checkpoints", "--no-last-checkpoints"] if keep_checkpoint else []
    options += [] if keep_checkpoint else ["--no-save"]
    arguments = pipeline.train_command(data_bin, run_dir, options, max_update)
    arguments[arguments.index("--user-dir") + 1] = plugin_dir()  # from any directory
    return [str(a) for a in arguments]


LAUNCHERS = {  # python: one process, the one whose peak memory is read
    "python": lambda arguments, processes: [
        *[sys.executable, str(Path(__file__).resolve()), "--child"],
        json.dumps([*arguments, "--distributed-world-size", "1"]),
    ],
    "torchrun": lambda arguments, processes: [
        *pipeline.tool("torchrun"),
        *["--standalone", f"--nproc_per_node={processes}", "-m", "fairseq_cli.train"],
        *[*arguments, "--distributed-world-size", str(processes)],
    ],
    "generate": lambda arguments, processes: [*pipeline.tool("fairseq-generate"), *arguments],
}


def run_step(name, launcher, arguments, run_dir, results, save, processes=1, **extra):
    """One step (a training or fairseq-generate), or its record from an earlier call
    with the same launcher and arguments; a failed one is tried again."""
    record = {"launcher": launcher, "arguments": arguments, **extra}
    earlier = results.get(name) or {}
    if {k: earlier.get(k) for k in record} == record and finished([earlier]):
        say(f"{name}: finished before, skipped")
        return earlier
    if run_dir.exists():
        say(f"{name}: removing the earlier attempt in {run_dir}; starting from scratch")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    say(f"{name}: {launcher} (log: {run_dir / 'step.log'})")
    lines = []

    def keep(line):
        lines.append(line.rstrip("\n"))
        if "overflow detected" in line or " | valid | " in line:
            say(f"{name}: {lines[-1].split(' | ')[-1]}")

    try:
        pipeline.run(LAUNCHERS[launcher](arguments, processes), run_dir / "step.log", keep)
    except SystemExit:  # pipeline.run's way of saying the command failed
        record["failed"] = error_line(lines)
    except OSError as error:  # it did not start
        record["failed"] = f"could not start {launcher}: {error}"
    if "failed" not in record and launcher == "generate":
        bleu = [line[line.index("Generate ") :] for line in lines if "BLEU4 = " in line]
        record["bleu_line"] = bleu[-1] if bleu else "no BLEU line in fairseq-generate's output"
    elif "failed" not in record:
        record.update(summarise_log(lines), processes=processes)
    say(f"{name}: FAILED: {record['failed']}" if "failed" in record else f"{name}: done")
    record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    results[name] = record
    save(results)
    return record


GENERATE = "--gen-subset test --beam 5 --remove-bpe sentencepiece --batch-size 128 --max-len-a 1.2 --max-len-b 10"


def run_all(args, data_bin, work, results):
    """Every training of the plan; torchrun and fairseq-generate right after the fp16
    runs (fp32 with --smoke), so that a call stopped at its limit has them."""
    import torch

    from fairseq_natbias import plugin_dir

    done, precision = {}, "fp32" if args.smoke else "fp16"
    steps = (results, lambda results: save(args, work, results))
    runs = plan(args.precisions, args.rounds)
    last = next((name for name, p, *_ in reversed(runs) if p == precision), None)
    for name, run_precision, arm, index in runs:
        run_dir = work / "runs" / f"{run_precision}-{arm}-{index}"
        keep = (run_precision, arm, index) == (precision, "default", 1)
        options = (arm, run_precision, args.max_update, args.smoke, keep)
        arguments = training_arguments(data_bin, run_dir, *options)
        done[name] = run_step(name, "python", arguments, run_dir, *steps)
        if name != last:
            continue
        run_dir = work / "runs" / f"torchrun-{precision}-default"
        options = ("default", precision, args.torchrun_updates, args.smoke, False)
        arguments = training_arguments(data_bin, run_dir, *options)
        gpus = 1 if args.smoke else min(2, max(1, torch.cuda.device_count()))
        done["torchrun"] = run_step("torchrun", "torchrun", arguments, run_dir, *steps, gpus)
        source = done[f"{precision} default 1"]
        if finished([source]):  # generated again when the checkpoint is new
            checkpoint = run_dir.parent / f"{precision}-default-1" / "checkpoint_best.pt"
            arguments = [str(data_bin), "--user-dir", plugin_dir(), "--path", str(checkpoint)]
            arguments += [*GENERATE.split(), "--cpu" if args.smoke else "--fp16"]
            trained = {"checkpoint_trained": source["finished"]}
            done["generate"] = run_step(
                "generate", "generate", arguments, work / "generate", *steps, **trained
            )
    return done


def finished(records):
    return [r for r in records if r and "failed" not in r]


def number(value, form="{:g}"):
    return "—" if value is None else form.format(value)


def scale_cells(default, stock):
    """Loss scale: default's min and final level >= stock's, overflow steps <= stock's."""
    worst = []
    for records in (default, stock):
        scales = [r["loss_scale"] for r in records if r.get("loss_scale")]
        if len(scales) < len(records) or not scales:
            return ["n/a (no loss scaling)"] * 3
        worst.append([min(s["min"] for s in scales), min(s["final_level"] for s in scales)])
        worst[-1].append(max(r["overflow_steps"] for r in records))
    verdicts = [
        better(ours, theirs) == ours for ours, theirs, better in zip(*worst, (max, max, min))
    ]
    return [f"{a:g} vs {b:g}: {'pass' if ok else 'FAIL'}" for a, b, ok in zip(*worst, verdicts)]


def ratio_cell(ours, theirs, key, target=None):
    """The ratio of two arms' figures (memory: the highest run; time: the median)."""
    values = [[r.get(key) for r in records] for records in (ours, theirs)]
    if not (ours and theirs) or any(None in v for v in values):
        return "—"
    pick = statistics.median if key == "seconds_per_update" else max
    ratio = pick(values[0]) / pick(values[1])
    return f"{ratio:.3f}" + ("" if target is None else f": {'pass' if ratio <= target else 'FAIL'}")


RUN_COLUMNS = "precision | arm | run | device | updates | loss scale: first | min | final level | last | overflow steps | gain | s/update (1/ups) | training peak (MiB) | validation peak (MiB) | final valid loss"
ARM_COLUMNS = "precision | loss scale min | loss scale final level | overflow steps | training peak, default/stock | s/update, default/stock | validation peak, default/stock | training peak, default/hook off | validation peak, default/hook off"


def run_row(precision, arm, index, record, smoke):
    cells = [precision, arm, str(index)]
    if not finished([record]):
        why = f"FAILED: {record['failed']}" if record else "not run"
        return "| " + " | ".join([*cells, why]) + " |" + " |" * (RUN_COLUMNS.count("|") - 3)
    scale, overflows = record["loss_scale"] or {}, str(record["overflow_steps"])
    cells += ["CPU smoke" if smoke else (record.get("device") or "CPU"), str(record["updates"])]
    cells += [number(scale.get(k)) for k in ("first", "min", "final_level", "last")]
    cells += [overflows, number(record.get("gain"), "{:.3f}")]
    cells += [number(record["seconds_per_update"], "{:.4f}")]
    for key in ("peak_train_bytes", "peak_valid_bytes"):
        cells.append(number(record.get(key) and record[key] / 2**20, "{:.0f}"))
    return "| " + " | ".join([*cells, number(record["final_valid_loss"], "{:.3f}")]) + " |"


def table(args, results):
    """The report: every run, then default against stock and against the hook off."""
    runs, precision = plan(args.precisions, args.rounds), "fp32" if args.smoke else "fp16"
    records = [results.get(name) for name, *_ in runs]
    found = {
        k: ", ".join(sorted({str(r[k]) for r in records if r and r.get(k)}))
        for k in ("device", "torch", "fairseq")
    }
    if "torchrun" in results:
        runs.append(("torchrun", precision, "torchrun", 1))
        records.append(results["torchrun"])
    by_precision = {}
    for (_, run_precision, arm, _), record in zip(runs, records):
        by_precision.setdefault(run_precision, {}).setdefault(arm, []).append(record)
    arms = []
    for run_precision, records_of in by_precision.items():
        default, stock, off = (finished(records_of.get(a, [])) for a in ARMS)
        cells = scale_cells(default, stock) if default and stock else ["—"] * 3
        cells.append(ratio_cell(default, stock, "peak_train_bytes", TARGET_RATIO))
        cells += [ratio_cell(default, stock, k) for k in ("seconds_per_update", "peak_valid_bytes")]
        cells += [ratio_cell(default, off, k) for k in ("peak_train_bytes", "peak_valid_bytes")]
        arms.append(f"| {run_precision} | " + " | ".join(cells) + " |")
    device = "CPU smoke (testing the script)" if args.smoke else found["device"]
    arm_text = "; ".join(f"{arm} `{' '.join(options)}`" for arm, options in ARMS.items())
    scaling = f"fp16 `{' '.join(LOSS_SCALING['fp16'])}`, amp `{' '.join(LOSS_SCALING['amp'])}`"
    generated = results.get("generate") or {"failed": "not run"}
    generated = generated.get("bleu_line") or f"FAILED: {generated['failed']}"
    lines = [
        "# GPU check (issue 18): the default against stock fairseq in half precision",
        "",
        f"- device: {device}; torch {found['torch']}; fairseq {found['fairseq']}",
        f"- data: Multi30k De-En, joint SentencePiece ({args.vocab_size} pieces); {args.data or 'WORKDIR/data'}",
        f"- {arm_text}; all `{' '.join(sizes(args.smoke))} --share-all-embeddings`",
        f"- {args.max_update} updates, `{' '.join(SCHEDULE)} --seed 1`; {scaling}",
        f"- command: `{' '.join(['python', 'research/gpu_check.py', *args.argv])}`",
        "",
        f"| {RUN_COLUMNS} |",
        "|---" * (RUN_COLUMNS.count("|") + 1) + "|",
        *(run_row(p, a, i, r, args.smoke) for (_, p, a, i), r in zip(runs, records)),
        "",
        f"| {ARM_COLUMNS} |",
        "|---" * (ARM_COLUMNS.count("|") + 1) + "|",
        *arms,
        "",
        f"torchrun: `torchrun --nproc_per_node=N` of the default ({args.torchrun_updates} updates, "
        "N = 2 with 2 GPUs, else 1: no process group then), its row above.",
        "",
        f"fairseq-generate (beam 5, --{precision} default 1's checkpoint): `{generated}`",
    ]
    return "\n".join(lines) + "\n"


def save(args, work, results):
    """results.json and the table, after every step (and copied with the logs to
    --copy-to: a call stopped at its limit keeps them)."""
    (work / "results.json.part").write_text(json.dumps(results, indent=1))
    (work / "results.json.part").replace(work / "results.json")  # whole or not at all
    (work / "gpu_check.md").write_text(text := table(args, results))
    if args.copy_to:
        (out := Path(args.copy_to)).mkdir(parents=True, exist_ok=True)
        for name in ("gpu_check.md", "results.json"):
            shutil.copyfile(work / name, out / name)
        with tarfile.open(out / "logs.tar.gz.part", "w:gz") as archive:
            for log in sorted(work.glob("**/*.log")):
                archive.add(log, arcname=str(log.relative_to(work)))
        (out / "logs.tar.gz.part").replace(out / "logs.tar.gz")
    return text


def parse_args(argv):
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__, formatter_class=raw)
    add = parser.add_argument
    add("--multi30k", default=os.environ.get("NATBIAS_MULTI30K", "../shared/data/multi30k"))
    add("--workdir", default="work/gpu_check")
    add("--data", help="the prepared data's folder, reused as it is (default: WORKDIR/data)")
    add("--prepare-only", action="store_true", help="prepare --data and stop; needs no GPU")
    add("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    for option in ("--rounds", "--max-update", "--torchrun-updates"):  # defaults below
        add(option, type=int)
    add("--vocab-size", type=int, default=8000)
    add("--copy-to", metavar="DIR", help="copy the table, results and logs here after each step")
    add("--smoke", action="store_true", help="the script itself on the CPU: tiny model, fp32")
    args = parser.parse_args(argv)
    args.precisions = ["fp32"] if args.smoke else args.precisions
    args.rounds = args.rounds if args.rounds is not None else (0 if args.smoke else 1)
    args.max_update = args.max_update or (2 if args.smoke else 300)
    args.torchrun_updates = args.torchrun_updates or (2 if args.smoke else 50)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1])
    args = parse_args(argv)
    try:
        data_fetch.check_folder(args.multi30k, data_fetch.LANGS, "--multi30k")
    except data_fetch.DataError as error:
        raise SystemExit(f"gpu_check: {error} (or set NATBIAS_MULTI30K)") from None
    if args.prepare_only and not args.data:
        raise SystemExit("gpu_check: --prepare-only needs --data DIR")
    import torch

    if not (args.prepare_only or args.smoke or torch.cuda.is_available()):
        raise SystemExit(
            f"gpu_check: no CUDA GPU: torch {torch.__version__} sees none; run this "
            "on a machine with a CUDA GPU, or add --smoke for the CPU smoke run"
        )
    work = Path(args.workdir).resolve()
    folder = Path(args.data).resolve() if args.data else work / "data"
    try:
        data_bin = pipeline.prepare(Path(args.multi30k), folder, args.vocab_size)
    except OSError as error:  # fairseq-preprocess could not start
        raise SystemExit(f"gpu_check: preparing the data failed: {error}") from None
    if args.prepare_only:
        return say(f"data ready in {data_bin}")
    work.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONUNBUFFERED"] = "1"
    results = json.loads(path.read_text()) if (path := work / "results.json").exists() else {}
    done = run_all(args, data_bin, work, results)
    print("\n" + save(args, work, results))
    missed = [name for name, record in done.items() if not finished([record])]
    if missed:
        raise SystemExit(f"gpu_check: failed or left out: {', '.join(missed)}; logs in {work}")


if __name__ == "__main__":
    main()
