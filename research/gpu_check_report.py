"""research/gpu_check.py's reading of fairseq 0.12's training logs, its
targets (default against stock) and its markdown table.

A run's record (results.json) holds what :func:`summarise_log` and the
training process's report (research/gpu_check_child.py) read; an arm's
figures pool its runs (the plan alternates default, stock, stock, default):

* loss scale (fp16, amp): the lowest scale of any run of the arm, the lowest
  final level (the highest scale logged in the last FINAL_WINDOW updates: the
  level the scale climbs back to between overflows, not the phase of its
  cycle that the last line happens to show) and the most overflow steps;
  targets: default's minimum and final level >= stock's, default's overflow
  steps <= stock's;
* seconds per update: every interval of LOG_INTERVAL updates between two
  train_inner lines (intervals holding an epoch's end and the start-up left
  out), pooled over the arm's runs; the ratio of the arms' medians; the noise
  is the largest run-to-run spread of the runs' medians within an arm, and the
  target (<= TARGET_RATIO) is marked FAIL only where the ratio exceeds it by
  more than that noise (``within noise`` in between);
* peak GPU memory: training and validation apart (the child folds fairseq's
  per-update resets into a running maximum); target on training (<=
  TARGET_RATIO); validation and the hook's share (default against the default
  with --no-natbias-logging) shown without a target.
"""

import json
import re
import shutil
import statistics
import tarfile
import time
from pathlib import Path

from natbias.tools import fairseq_logs

TARGET_RATIO = 1.02  # seconds per update and training peak memory, default/stock
FINAL_WINDOW = 50  # updates at the end whose highest loss scale is the final level
ARM_NAMES = {
    "default": "default",
    "stock": "stock",
    "hookoff": "default, hook off",
    "order2": "default, --natbias-order 2",
}
CHILD_MARK = "gpu_check child: "
LOG_INTERVAL = 10  # updates between train_inner lines on the GPU

# --- reading a training log ----------------------------------------------------------

# The notes fairseq 0.12 writes for a step whose gradient overflowed and the
# loss scale it moves to: FP16Optimizer's (--fp16: the update is skipped) and
# AMPOptimizer's (--amp: the batch is tried again, at most
# --amp-batch-retries times, then dropped with "AMP: skipping this batch.").
OVERFLOW_SCALE = (
    re.compile(r"gradient overflow detected.*setting loss scale to: ([-+.\deE]+)"),
    re.compile(r"AMP: overflow detected, setting scale to to ([-+.\deE]+)"),
)


def inner_records(lines):
    """(line index, record) of each train_inner line (every --log-interval updates)."""
    records = ((i, fairseq_logs.parse_line(line)) for i, line in enumerate(lines))
    return [(i, r) for i, r in records if r is not None and r.tag == fairseq_logs.TRAIN_INNER]


def loss_scale_trajectory(lines, window=FINAL_WINDOW):
    """first, min, final level and last loss scale, from the train_inner lines
    (the scale after their interval's last update) and the overflow notes
    (where it dips between two log lines); None without loss scaling."""
    logged = [
        (r.num_updates, r.values["loss_scale"])
        for _, r in inner_records(lines)
        if "loss_scale" in r.values
    ]
    if not logged:
        return None
    noted = [
        float(match[1])
        for line in lines
        for pattern in OVERFLOW_SCALE
        for match in [pattern.search(line)]
        if match
    ]
    end = logged[-1][0]
    return {
        "first": logged[0][1],
        "min": min([s for _, s in logged] + noted),
        "final_level": max(s for u, s in logged if u > end - window),
        "last": logged[-1][1],
    }


def overflow_steps(lines):
    """Steps whose gradient overflowed (inf/nan), each thrown away: fairseq
    notes each one ("NOTE: gradient overflow detected ..." under --fp16, where
    the update is skipped; "AMP: overflow detected ..." under --amp, where the
    batch is tried again)."""
    return sum("overflow detected" in line for line in lines)


def dropped_batches(lines):
    """Batches --amp gave up on after its retries."""
    return sum("AMP: skipping this batch" in line for line in lines)


def interval_rates(lines, times):
    """Seconds per update of each interval between consecutive train_inner
    lines as they arrived (``times``: when each line did). Intervals holding an
    epoch's end (validation, checkpoint, new batches: its lines mention the
    epoch) are left out, and so is everything before the first line (start-up,
    CUDA warm-up)."""
    marks = inner_records(lines)
    rates = []
    for (i0, r0), (i1, r1) in zip(marks, marks[1:]):
        if any("epoch" in line for line in lines[i0 + 1 : i1]) or r1.num_updates <= r0.num_updates:
            continue
        rates.append((times[i1] - times[i0]) / (r1.num_updates - r0.num_updates))
    return rates


def last_logged(lines, key):
    values = [r.values[key] for _, r in inner_records(lines) if key in r.values]
    return values[-1] if values else None


def summarise_log(lines, times):
    records = fairseq_logs.parse_lines(lines)
    valid = [r for r in records if r.tag == fairseq_logs.VALID]
    updates = [r.num_updates for r in records if r.num_updates is not None]
    rates = interval_rates(lines, times)
    return {
        "updates": max(updates) if updates else 0,
        "loss_scale": loss_scale_trajectory(lines),
        "overflow_steps": overflow_steps(lines),
        "dropped_batches": dropped_batches(lines),
        "gain": last_logged(lines, "gain"),
        "interval_seconds_per_update": [round(r, 6) for r in rates],
        "seconds_per_update": round(statistics.median(rates), 6) if rates else None,
        "final_valid_loss": valid[-1].values.get("loss") if valid else None,
    }


def child_report(lines):
    """What the training process printed after training: device, peak memory, versions."""
    found = [json.loads(line[len(CHILD_MARK) :]) for line in lines if line.startswith(CHILD_MARK)]
    return found[-1] if found else {}


ERROR_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b(?::|$)"
)


def error_line(lines):
    """The line that says why a command failed: the last exception line
    (``ValueError: ...``) other than torchrun's own ChildFailedError, whose
    banner follows the child's; else the last non-empty line."""
    lines = [line.strip() for line in lines if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line) and "ChildFailedError" not in line]
    if errors:
        return errors[-1]
    return lines[-1] if lines else "no output"


def bleu_line(lines):
    """fairseq-generate's "Generate test with beam=5: BLEU4 = ..." line, without
    the logging prefix."""
    found = [
        line[line.index("Generate ") :] for line in lines if re.search(r"Generate .*BLEU", line)
    ]
    return found[-1] if found else "no BLEU line in fairseq-generate's output"


# --- an arm's figures and the targets ----------------------------------------------------


def finished(records):
    return [r for r in records if r and "failed" not in r and "left_out" not in r]


def arm_scale(records):
    """The arm's worst loss-scale figures over its runs; None without loss scaling."""
    scales = [r["loss_scale"] for r in records if r.get("loss_scale")]
    if not scales or len(scales) < len(records):
        return None
    return {
        "min": min(s["min"] for s in scales),
        "final_level": min(s["final_level"] for s in scales),
        "overflow_steps": max(r["overflow_steps"] for r in records),
    }


def scale_cells(default, stock):
    """The three loss-scale targets: min (>=), final level (>=), overflow steps (<=)."""
    ours, theirs = arm_scale(default), arm_scale(stock)
    if ours is None or theirs is None:
        return ["n/a (no loss scaling)"] * 3
    cells = []
    for key, better in (("min", max), ("final_level", max), ("overflow_steps", min)):
        ok = better(ours[key], theirs[key]) == ours[key]
        cells.append(f"{ours[key]:g} vs {theirs[key]:g}: {'pass' if ok else 'FAIL'}")
    return cells


def arm_time(records):
    """(median of the arm's pooled interval rates, the runs' medians)."""
    pooled = [x for r in records for x in r.get("interval_seconds_per_update") or []]
    runs = [
        statistics.median(r["interval_seconds_per_update"])
        for r in records
        if r.get("interval_seconds_per_update")
    ]
    return (statistics.median(pooled) if pooled else None), runs


def spread(run_medians):
    """Run-to-run spread of an arm, relative to its middle: None with one run."""
    if len(run_medians) < 2:
        return None
    return (max(run_medians) - min(run_medians)) / statistics.median(run_medians)


def time_cell(default, stock, target=TARGET_RATIO):
    (ours, our_runs), (theirs, their_runs) = arm_time(default), arm_time(stock)
    if ours is None or theirs is None:
        return "—"
    ratio = ours / theirs
    spreads = [spread(our_runs), spread(their_runs)]
    noise = None if None in spreads else max(spreads)
    shown = f"{ratio:.3f} (noise ±{noise:.1%})" if noise is not None else f"{ratio:.3f}"
    if noise is None:  # one run per arm: a ratio under the target proves no more
        verdict = "no verdict: one run per arm, noise not measured"
    elif ratio <= target:
        verdict = "pass"
    elif ratio - target > noise:
        verdict = "FAIL"
    else:
        verdict = "within noise"
    return f"{shown}: {verdict}"


def peak(records, key):
    values = [r.get(key) for r in records]
    return None if not values or None in values else max(values)


def memory_cell(default, stock, key, target=TARGET_RATIO):
    ours, theirs = peak(default, key), peak(stock, key)
    if ours is None or theirs is None:
        return "n/a (no GPU)"
    ratio = ours / theirs
    if target is None:
        return f"{ratio:.3f}"
    return f"{ratio:.3f}: {'pass' if ratio <= target else 'FAIL'}"


def target_row(precision, by_arm):
    default, stock = finished(by_arm.get("default", [])), finished(by_arm.get("stock", []))
    if not default or not stock:
        return f"| {precision} | — | — | — | — | — (no finished run of an arm) |"
    cells = [
        *scale_cells(default, stock),
        time_cell(default, stock),
        memory_cell(default, stock, "peak_train_bytes"),
    ]
    return f"| {precision} | " + " | ".join(cells) + " |"


def order2_row(precision, by_arm):
    """Order 2 against order 1 (the default), no target: cost per update and
    training peak memory, and the final validation losses."""
    default, order2 = finished(by_arm.get("default", [])), finished(by_arm.get("order2", []))
    if not default or not order2:
        return None
    losses = [
        statistics.median(r["final_valid_loss"] for r in records)
        if all(r["final_valid_loss"] is not None for r in records)
        else None
        for records in (order2, default)
    ]
    (ours, _), (theirs, _) = arm_time(order2), arm_time(default)
    speed = f"{ours / theirs:.3f}" if ours and theirs else "—"
    return (
        f"| {precision} | {speed} | "
        f"{memory_cell(order2, default, 'peak_train_bytes', None)} | "
        f"{number(losses[0], '{:.3f}')} vs {number(losses[1], '{:.3f}')} |"
    )


def memory_row(precision, by_arm):
    default, stock = finished(by_arm.get("default", [])), finished(by_arm.get("stock", []))
    off = finished(by_arm.get("hookoff", []))
    cells = [memory_cell(default, stock, "peak_valid_bytes", None) if default and stock else "—"]
    for key in ("peak_train_bytes", "peak_valid_bytes"):
        cells.append(memory_cell(default, off, key, None) if default and off else "—")
    return f"| {precision} | " + " | ".join(cells) + " |"


# --- the table ------------------------------------------------------------------------------


def number(value, form="{:g}"):
    return "—" if value is None else form.format(value)


def mib(value):
    return "n/a" if value is None else f"{value / 2**20:.0f}"


RUN_COLUMNS = [
    "precision",
    "arm",
    "run",
    "device",
    "updates",
    "loss scale: first",
    "min",
    "final level",
    "last",
    "overflow steps",
    "gain",
    "s/update (median)",
    "training peak (MiB)",
    "validation peak (MiB)",
    "final valid loss",
]


def run_row(precision, arm, index, record, smoke):
    head = [precision, ARM_NAMES[arm], str(index)]
    if record is None or "failed" in record or "left_out" in record:
        why = (
            "not run"
            if record is None
            else f"FAILED: {record['failed']}"
            if "failed" in record
            else f"not run: {record['left_out']}"
        )
        return "| " + " | ".join(head + [why]) + " |" + " |" * (len(RUN_COLUMNS) - 4)
    scale = record["loss_scale"] or {}
    device = "CPU smoke" if smoke else (record.get("device") or "CPU")
    overflows = str(record["overflow_steps"])
    if record.get("dropped_batches"):
        overflows += f" ({record['dropped_batches']} batches dropped)"
    cells = head + [
        device,
        str(record["updates"]),
        number(scale.get("first")),
        number(scale.get("min")),
        number(scale.get("final_level")),
        number(scale.get("last")),
        overflows,
        number(record.get("gain"), "{:.3f}"),
        number(record["seconds_per_update"], "{:.4f}"),
        mib(record.get("peak_train_bytes")),
        mib(record.get("peak_valid_bytes")),
        number(record["final_valid_loss"], "{:.3f}"),
    ]
    return "| " + " | ".join(cells) + " |"


def versions(records):
    def named(key):
        return ", ".join(sorted({str(r[key]) for r in records if r.get(key)})) or "—"

    return named("device"), named("torch"), named("fairseq")


def markdown(plan, results, header, extra, smoke):
    """The report: ``header`` lines, one row per run of ``plan`` ((name,
    precision, arm, index) each), the targets, the memory split, ``extra``."""
    records = [results.get(name) for name, *_ in plan]
    device, torch_version, fairseq_version = versions([r for r in records if r])
    if smoke:
        device = "CPU smoke (no GPU: these figures test the script, not the package)"
    by_precision = {}
    for (_name, precision, arm, _), record in zip(plan, records):
        by_precision.setdefault(precision, {}).setdefault(arm, []).append(record)
    lines = [
        "# GPU check (issue 18): the default against stock fairseq in half precision",
        "",
        f"- device: {device}; torch {torch_version}; fairseq {fairseq_version}",
        *header,
        "",
        "| " + " | ".join(RUN_COLUMNS) + " |",
        "|---" * len(RUN_COLUMNS) + "|",
        *(run_row(p, a, i, r, smoke) for (_, p, a, i), r in zip(plan, records)),
        "",
        "Targets, default against stock (an arm's runs pooled): loss scale minimum and final "
        f"level >= stock's, overflow steps <= stock's; s/update ratio <= {TARGET_RATIO} "
        "(FAIL only beyond the measured run-to-run noise); training peak memory ratio "
        f"<= {TARGET_RATIO}.",
        "",
        "| precision | loss scale min | loss scale final level | overflow steps | "
        "s/update, default/stock | training peak memory, default/stock |",
        "|---|---|---|---|---|---|",
        *(target_row(p, arms) for p, arms in by_precision.items()),
        "",
        "Memory without a target: the validation peak, and the logging hook's share "
        "(the default against the default with --no-natbias-logging).",
        "",
        "| precision | validation peak, default/stock | training peak, default/hook off | "
        "validation peak, default/hook off |",
        "|---|---|---|---|",
        *(memory_row(p, arms) for p, arms in by_precision.items()),
        "",
        *order2_table(by_precision),
        *extra,
    ]
    return "\n".join(lines) + "\n"


def order2_table(by_precision):
    rows = [row for row in (order2_row(p, arms) for p, arms in by_precision.items()) if row]
    if not rows:
        return []
    return [
        "The bigram residual (--natbias-order 2, added in float32) against the default, no target:",
        "",
        "| precision | s/update, order 2/default | training peak, order 2/default | "
        "final valid loss, order 2 vs default |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


# --- the lines below the tables -------------------------------------------------------


HOW_MEASURED = (
    "How measured: loss scale from fairseq's train_inner lines (the minimum also from its "
    "overflow notes; the final level is the highest scale logged in the last "
    f"{FINAL_WINDOW} updates); overflow steps = fairseq's overflow notes (fp16: "
    "skipped updates; amp: retried steps, dropped batches in brackets); gain = the last "
    "logged g of the default; s/update = the median over the intervals between "
    f"consecutive train_inner lines (--log-interval {LOG_INTERVAL}; 1 with --smoke) as "
    "they arrived, "
    "without those holding an epoch's end and the start-up; peak memory = "
    "torch.cuda.max_memory_allocated() in the training process, fairseq's reset after "
    "every update folded into a running maximum, validation (fairseq_cli.train.validate) "
    "apart; valid loss = label-smoothed loss in bits at the last validation."
)
BF16_NOTE = (
    "bf16: fairseq 0.12's --bf16 implies --tpu, whose code needs torch_xla; the "
    "training process undoes that one implication (for both arms), or --bf16 could "
    "not train on a GPU at all."
)


def torchrun_line(record, updates, precision, why_not):
    what = f"default, --{precision}" if precision != "fp32" else "default, fp32, --cpu"
    if record is None:
        return f"torchrun ({what}): not run, {why_not}"
    if "left_out" in record:
        return f"torchrun ({what}): not run: {record['left_out']}"
    processes = record.get("processes", 1)
    launched = f"torchrun --nproc_per_node={processes} ({what}, {updates} updates)"
    if processes == 1:
        launched += (
            " [one process: the machine has one GPU (or none), so no process group "
            "and no DDP were tested]"
        )
    else:
        launched += f" [{processes} processes, ranks that joined: {record.get('ranks')}]"
    if "failed" in record:
        return f"{launched}: FAILED: {record['failed']}"
    scale = record["loss_scale"] or {}
    return (
        f"{launched}: reached update {record['updates']}, loss scale "
        f"{number(scale.get('last'))}, {record['overflow_steps']} overflow steps, "
        f"{number(record['seconds_per_update'], '{:.4f}')} s/update, valid loss "
        f"{number(record['final_valid_loss'], '{:.3f}')}"
    )


def generate_line(record, precision, why_not):
    flag = "--cpu" if precision == "fp32" else "--fp16"
    where = f"{flag}, on the {precision} default 1's checkpoint_best.pt"
    if record is None:
        return f"fairseq-generate ({where}): not run, {why_not}"
    result = f"FAILED: {record['failed']}" if "failed" in record else f"`{record['bleu_line']}`"
    return f"fairseq-generate (beam 5, {where}): {result}"


# --- results and table after every step ---------------------------------------------


class Steps:
    """The steps' results, kept in WORKDIR/results.json and the table after
    every step (copied to ``copy_to`` too), and the time budget."""

    def __init__(self, work, results, budget, copy_to, write_table):
        self.work, self.results, self.budget = work, results, budget
        self.copy_to, self.write_table = copy_to, write_table
        self.start, self.longest = time.monotonic(), 0.0

    def over_budget(self):
        """Why the next step is left out (None: it runs): a step as long as
        the longest so far would end after --time-budget seconds."""
        if self.budget is None:
            return None
        if time.monotonic() - self.start + self.longest > self.budget:
            return f"--time-budget {self.budget:g} s reached"
        return None

    def done(self, name, record, seconds):
        self.results[name] = record
        self.longest = max(self.longest, seconds)
        self.save()

    def save(self):
        path = self.work / "results.json"
        partial = path.with_name(path.name + ".part")
        partial.write_text(json.dumps(self.results, indent=1))
        partial.replace(path)  # whole or not at all, should the script be stopped here
        table = self.write_table(self.results)
        (self.work / "gpu_check.md").write_text(table)
        if self.copy_to:
            copy_out(self.work, Path(self.copy_to))
        return table


def copy_out(work, destination):
    """The table, the results and the logs (one .tar.gz) into ``destination``."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in ("gpu_check.md", "results.json"):
        shutil.copyfile(work / name, destination / name)
    partial = destination / "logs.tar.gz.part"
    with tarfile.open(partial, "w:gz") as archive:
        for log in sorted(work.glob("**/*.log")):
            archive.add(log, arcname=str(log.relative_to(work)))
    partial.replace(destination / "logs.tar.gz")
