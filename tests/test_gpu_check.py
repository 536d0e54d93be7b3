"""benchmarks/gpu_check.py: its log reading on hand-written fairseq 0.12 lines,
and the whole script with --smoke (CPU) on a slice of real Multi30k: table,
figures read back from the logs, finished runs skipped, the no-GPU stop."""

import json
import os
import re
import subprocess
import sys

import pytest

from natbias_testing import REPO, benchmark_script, write_multi30k_slice

SCRIPT = REPO / "benchmarks" / "gpu_check.py"
SLICE = {"train": 1500, "val": 60, "test_2016_flickr": 40}


def load_script():
    return benchmark_script("gpu_check")


gpu_check = load_script()

# --- the log reading, on lines as fairseq 0.12 writes them --------------------------

PREFIX = "2024-05-01 10:00:{:02d} | INFO | "


def inner(second, update, scale=None):
    scale_part = f", loss_scale={scale:g}" if scale is not None else ""
    return (PREFIX.format(second) + f"train_inner | epoch 001:     {update} / 103 loss=13.1, "
            f"nll_loss=13.05, ppl=8480.1, wps=20311.2, ups=5.12, wpb=3967.2, bsz=140.2, "
            f"num_updates={update}, lr=1.34e-06, gnorm=4.5{scale_part}, train_wall=2, "
            f"gb_free=70.1, wall={second}")


def note(second, text):
    return PREFIX.format(second) + f"fairseq.trainer | {text}"


FP16_LOG = [
    note(0, "begin training epoch 1"),
    note(1, "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0"),
    inner(2, 10, 64),
    note(3, "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 32.0"),
    note(3, "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 16.0"),
    inner(4, 20, 16),
    inner(6, 30, 16),
    PREFIX.format(7) + "fairseq_cli.train | end of epoch 1 (average epoch stats below)",
    PREFIX.format(7) + "valid | epoch 001 | valid on 'valid' subset | loss 12.5 | "
                       "nll_loss 12.4 | ppl 5404 | wps 80000 | wpb 3000 | bsz 100 | num_updates 33",
    note(8, "begin training epoch 2"),
    inner(9, 40, 16),
    inner(10, 50, 32),
]
# When each line arrived (s): 10 updates in 2 s, the epoch's end in between 30 and 40.
FP16_TIMES = [0.0, 1.0, 2.0, 3.0, 3.1, 4.0, 6.0, 7.0, 7.5, 8.0, 9.0, 10.5]


def test_loss_scale_trajectory_from_train_inner_lines_and_overflow_notes():
    trajectory = gpu_check.loss_scale_trajectory(FP16_LOG, at=20)
    assert trajectory == {"first": 64, "min": 16, "at": 16, "at_update": 20, "last": 32}
    # Update 200 was never logged here: no value rather than a neighbour's.
    assert gpu_check.loss_scale_trajectory(FP16_LOG)["at"] is None


def test_loss_scale_minimum_from_a_note_between_log_lines():
    # The scale fell to 8 and was back at 16 by the next log line: the notes
    # are the only place the minimum shows.
    lines = [inner(1, 10, 16),
             note(2, "NOTE: gradient overflow detected, ignoring gradient, "
                     "setting loss scale to: 8.0"),
             inner(3, 20, 16)]
    assert gpu_check.loss_scale_trajectory(lines)["min"] == 8


def test_amp_overflow_notes_are_counted_and_read():
    lines = [inner(1, 10, 65536.0), note(2, "AMP: overflow detected, setting scale to to 32768.0"),
             inner(3, 20, 32768.0)]
    assert gpu_check.skipped_updates(lines) == 1
    assert gpu_check.loss_scale_trajectory(lines)["min"] == 32768


def test_skipped_updates_count_each_overflow_note():
    assert gpu_check.skipped_updates(FP16_LOG) == 3
    # "overflow in param NAME" lines follow a note; they are not further skips.
    with_param = FP16_LOG + [note(11, "overflow in param decoder.output_projection.gain_param")]
    assert gpu_check.skipped_updates(with_param) == 3


def test_no_loss_scale_without_loss_scaling():
    lines = [inner(1, 10), inner(2, 20)]
    assert gpu_check.loss_scale_trajectory(lines) is None
    assert gpu_check.skipped_updates(lines) == 0


def test_seconds_per_update_leaves_out_start_up_and_epoch_ends():
    per_update, timed = gpu_check.seconds_per_update(FP16_LOG, FP16_TIMES)
    # Timed: 10->20 (2 s), 20->30 (2 s), 40->50 (1.5 s); 30->40 holds the
    # validation, the time before update 10 the start-up.
    assert timed == 30
    assert per_update == pytest.approx(5.5 / 30)


def test_summary_of_a_log():
    summary = gpu_check.summarise_log(FP16_LOG, FP16_TIMES)
    assert summary["updates"] == 50
    assert summary["final_valid_loss"] == 12.5
    assert summary["skipped_updates"] == 3


def test_bleu_line_without_the_logging_prefix():
    lines = ["H-0\t-0.5\tA man .",
             "2024-05-01 10:01:00 | INFO | fairseq_cli.generate | Generate test with beam=5: "
             "BLEU4 = 12.34, 40.0/15.0/8.0/4.0 (BP=1.000, ratio=1.010, syslen=12000, reflen=11880)"]
    assert gpu_check.bleu_line(lines) == ("Generate test with beam=5: BLEU4 = 12.34, "
                                          "40.0/15.0/8.0/4.0 (BP=1.000, ratio=1.010, "
                                          "syslen=12000, reflen=11880)")


def test_targets_pass_and_fail():
    def run(at):
        return {"loss_scale": {"at": at}}

    assert gpu_check.loss_scale_cell(run(32), run(64)).endswith("pass")
    assert gpu_check.loss_scale_cell(run(16), run(64)).endswith("FAIL")
    assert gpu_check.loss_scale_cell(run(256), run(64)).endswith("FAIL")
    assert gpu_check.loss_scale_cell({"loss_scale": None}, {"loss_scale": None}).startswith("n/a")
    assert gpu_check.ratio_cell(1.01, 1.0, 1.02) == "1.010 pass"
    assert gpu_check.ratio_cell(1.03, 1.0, 1.02) == "1.030 FAIL"


def gpu_record(scale_at_200, seconds, memory_mib, loss=9.5):
    """A finished run as the script records it on a GPU."""
    scale = None if scale_at_200 is None else {"first": 128.0, "min": scale_at_200,
                                               "at": scale_at_200, "at_update": 200,
                                               "last": scale_at_200}
    return {"updates": 300, "loss_scale": scale, "skipped_updates": 2, "timed_updates": 260,
            "seconds_per_update": seconds, "final_valid_loss": loss,
            "peak_memory_bytes": memory_mib * 2**20, "device": "NVIDIA H100 80GB HBM3",
            "torch": "2.13.0", "fairseq": "0.12.3"}


def test_gpu_table_names_the_gpu_and_marks_the_targets():
    results = {}
    for precision in gpu_check.PRECISIONS:
        scaled = precision in ("fp16", "amp")
        results[f"{precision} stock"] = gpu_record(64.0 if scaled else None, 0.0500, 1000)
        results[f"{precision} default"] = gpu_record(64.0 if scaled else None, 0.0505, 1010)
    results["amp default"] = gpu_record(8.0, 0.0530, 1100)  # misses all three targets
    results["bf16 default"] = {"failed": "RuntimeError: CUDA out of memory"}
    args = gpu_check.parse_args(["--workdir", "w"])
    table = gpu_check.markdown(gpu_check.plan(False), results, args, ["(extra line)"])

    assert "device: NVIDIA H100 80GB HBM3; torch 2.13.0; fairseq 0.12.3" in table
    rows = table_rows(table)
    assert len(rows) == 8  # a failed run's row has its error instead of figures
    assert rows["bf16", "default"][2:] == ["FAILED: RuntimeError: CUDA out of memory"] + [""] * 9
    assert rows["fp16", "default"][2:] == ["NVIDIA H100 80GB HBM3", "300", "128", "64", "64",
                                          "64", "2", "0.0505", "1010", "9.500"]
    assert "| fp16 | 64 vs 64: pass | 1.010 pass | 1.010 pass |" in table
    assert "| amp | 8 vs 64: FAIL | 1.060 FAIL | 1.100 FAIL |" in table
    assert "| fp32 | n/a (no loss scaling) | 1.010 pass | 1.010 pass |" in table
    assert "| bf16 | — | — | — (a run failed) |" in table
    assert "(extra line)" in table and "implies --tpu" in table


# --- the script itself, --smoke on the CPU -------------------------------------------


@pytest.fixture(scope="module")
def multi30k_slice(tmp_path_factory):
    return write_multi30k_slice(tmp_path_factory.mktemp("multi30k_slice"), SLICE)


def run_script(*args, check=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"gpu_check.py failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def smoke(multi30k_slice, tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu_check")
    command = ["--smoke", "--multi30k", multi30k_slice, "--workdir", work, "--vocab-size", 1000]
    return work, command, run_script(*command)


def table_rows(table):
    """{(precision, arm): cells} of the runs' table."""
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 12 and cells[0] in gpu_check.PRECISIONS:
            rows[cells[0], cells[1]] = cells
    return rows


def test_smoke_table_names_the_cpu_and_holds_both_arms(smoke):
    work, _, first = smoke
    table = (work / "gpu_check.md").read_text()
    assert table in first.stdout
    assert "device: CPU smoke" in table
    rows = table_rows(table)
    assert set(rows) == {("fp32", "default"), ("fp32", "stock")}
    assert all(cells[2] == "CPU smoke" for cells in rows.values())
    assert "fp16, bf16, amp: skipped" in table
    assert "torchrun --nproc_per_node=1: skipped (--smoke)" in table
    for arm in gpu_check.ARMS:  # progress as it goes
        assert f"fp32 {arm}: update 2/2, loss " in first.stdout
        assert f"fp32 {arm}: update 2, valid loss " in first.stdout


def test_smoke_figures_are_those_of_the_logs(smoke):
    work, _, _ = smoke
    rows = table_rows((work / "gpu_check.md").read_text())
    results = json.loads((work / "results.json").read_text())
    for arm in gpu_check.ARMS:
        log = (work / "runs" / f"fp32-{arm}" / "train.log").read_text()
        cells = rows["fp32", arm]
        # Read here with plain regular expressions, not the script's reader.
        valid_losses = re.findall(r"\| valid \| .*? \| loss ([\d.]+) \|", log)
        updates = re.findall(r"\| train_inner \| .*num_updates=(\d+)", log)
        assert updates == ["1", "2"]
        assert cells[3] == "2"
        assert cells[11] == f"{float(valid_losses[-1]):.3f}"
        assert cells[8] == str(log.count("overflow detected")) == "0"
        # fp32: no loss scaling, so no loss_scale on the train_inner lines
        assert not re.search(r"train_inner \|.*[ ,]loss_scale=", log)
        assert cells[4:8] == ["—"] * 4
        assert cells[10] == "n/a (CPU)"
        per_update = results[f"fp32 {arm}"]["seconds_per_update"]
        assert cells[9] == f"{per_update:.4f}" and 0 < per_update < 60
        assert results[f"fp32 {arm}"]["timed_updates"] == 1  # update 1 -> 2
    generated = re.search(r"Generate test with beam=5: BLEU4 = [^\n]*",
                          (work / "generate" / "generate.log").read_text())[0]
    assert f"`{generated}`" in (work / "gpu_check.md").read_text()


def test_smoke_second_run_skips_finished_runs(smoke):
    work, command, first = smoke
    logs = [work / "runs" / f"fp32-{arm}" / "train.log" for arm in gpu_check.ARMS]
    written = [log.stat().st_mtime_ns for log in logs]
    table = (work / "gpu_check.md").read_text()

    again = run_script(*command)
    assert "preprocess: " in again.stdout and "exists, skipped" in again.stdout
    for name in ("fp32 default", "fp32 stock", "generate"):
        assert f"{name}: finished before, skipped" in again.stdout
    assert "updates with python -c" not in again.stdout
    assert [log.stat().st_mtime_ns for log in logs] == written
    assert (work / "gpu_check.md").read_text() == table


# --- one run's bookkeeping, with a stand-in for fairseq-train --------------------------


@pytest.fixture
def fake_launchers(monkeypatch, tmp_path):
    """Launchers that print FP16_LOG as fairseq-train would, and one that
    fails part way as fairseq does at its minimum loss scale."""
    log = tmp_path / "fp16.log"
    log.write_text("\n".join(FP16_LOG) + "\n")
    monkeypatch.setitem(gpu_check.LAUNCHERS, "fake", lambda arguments: [
        sys.executable, "-c", "import sys; print(open(sys.argv[1]).read(), end='')", str(log)])
    monkeypatch.setitem(gpu_check.LAUNCHERS, "failing", lambda arguments: [
        sys.executable, "-c", "print('epoch 001: 10 / 103 loss=13.1'); raise SystemExit("
        "'FloatingPointError: Minimum loss scale reached (0.0001).')"])


def test_a_run_is_recorded_then_skipped_and_an_interrupted_one_restarted(
        fake_launchers, tmp_path, capsys):
    results, run_dir = {}, tmp_path / "run"
    record = gpu_check.train("fp16 default", "fake", ["a"], run_dir, results, 50)
    assert results["fp16 default"] is record
    assert record["skipped_updates"] == 3 and record["loss_scale"]["last"] == 32
    assert record["final_valid_loss"] == 12.5 and record["timed_updates"] == 30
    assert (run_dir / "train.log").read_text().splitlines() == FP16_LOG
    written = (run_dir / "train.log").stat().st_mtime_ns

    assert gpu_check.train("fp16 default", "fake", ["a"], run_dir, results, 50) is record
    assert "fp16 default: finished before, skipped" in capsys.readouterr().out
    assert (run_dir / "train.log").stat().st_mtime_ns == written

    # Other arguments: run again, from scratch.
    (run_dir / "checkpoint_last.pt").write_text("from the earlier attempt")
    again = gpu_check.train("fp16 default", "fake", ["b"], run_dir, results, 50)
    assert again is not record and again["arguments"] == ["b"]
    assert "removing the earlier attempt" in capsys.readouterr().out
    assert not (run_dir / "checkpoint_last.pt").exists()  # fairseq would have resumed from it
    assert (run_dir / "train.log").read_text().splitlines() == FP16_LOG  # not appended to

    # Stopped part way (its folder there, its result not): from scratch too.
    del results["fp16 default"]
    (run_dir / "checkpoint_last.pt").write_text("from the stopped attempt")
    gpu_check.train("fp16 default", "fake", ["b"], run_dir, results, 50)
    assert "removing the earlier attempt" in capsys.readouterr().out
    assert not (run_dir / "checkpoint_last.pt").exists()


def test_a_failed_run_is_recorded_with_its_error_and_tried_again(fake_launchers, tmp_path):
    results, run_dir = {}, tmp_path / "run"
    record = gpu_check.train("fp16 default", "failing", ["a"], run_dir, results, 50)
    assert record["failed"] == "FloatingPointError: Minimum loss scale reached (0.0001)."
    assert "FAILED: FloatingPointError" in gpu_check.run_row("fp16", "default", record, False)
    assert "a run failed" in gpu_check.target_row("fp16", record, {"loss_scale": None})
    retried = gpu_check.train("fp16 default", "failing", ["a"], run_dir, results, 50)
    assert retried is not record and "failed" in retried


def test_without_a_gpu_it_stops_in_one_line(multi30k_slice, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = run_script("--multi30k", multi30k_slice, "--workdir", tmp_path / "work", check=False)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA GPU: ")
    assert "--smoke" in lines[0]
    assert not (tmp_path / "work").exists()


def test_missing_data_stops_in_one_line_naming_the_option(tmp_path):
    with pytest.raises(SystemExit) as stop:
        gpu_check.raw_data(tmp_path / "nowhere")
    message = str(stop.value)
    assert message.startswith(f"gpu_check: --multi30k={tmp_path / 'nowhere'}: no such folder")
    assert "NATBIAS_MULTI30K" in message and "\n" not in message
