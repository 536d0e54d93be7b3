"""research/gpu_check.py: the tools found without scripts, one run's
bookkeeping with stand-ins for fairseq-train (recorded, skipped, failed, not
started, left out by the time budget; the table written and copied after
every step), and the whole script with --smoke (CPU) on a slice of real
Multi30k, run from a Python whose folder has no fairseq scripts and with none
on PATH (as after ``pip install --target``). The log reading, the targets and
the wheel check: tests/test_gpu_check_report.py."""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from natbias_testing import REPO, write_multi30k_slice
from research_scripts import benchmark_script
from test_gpu_check_report import FP16_LOG, table_rows

SCRIPT = REPO / "research" / "gpu_check.py"
SLICE = {"train": 1500, "val": 60, "test_2016_flickr": 40}

gpu_check = benchmark_script("gpu_check")
report = benchmark_script("gpu_check_report")
import pipeline  # noqa: E402  (the module gpu_check.py imported, examples/paper/pipeline.py)

# --- the tools, however they were installed -------------------------------------------


def test_tools_beside_this_python_as_in_a_virtual_environment():
    beside = Path(sys.executable).parent
    for name in (
        "fairseq-train",
        "natbias-step0",
        "fairseq-preprocess",
        "fairseq-generate",
        "fairseq-eval-lm",
        "torchrun",
    ):
        assert (beside / name).is_file(), name
        assert pipeline.tool(name) == [str(beside / name)]


def test_tools_without_scripts_beside_python_run_as_modules_of_the_same_python(
    monkeypatch, tmp_path
):
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python3"  # a folder with no scripts, as after --target
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert pipeline.tool("fairseq-preprocess") == [str(python), "-m", "fairseq_cli.preprocess"]
    assert pipeline.tool("fairseq-generate") == [str(python), "-m", "fairseq_cli.generate"]
    assert pipeline.tool("torchrun") == [str(python), "-m", "torch.distributed.run"]
    with pytest.raises(FileNotFoundError, match="natbias-unknown: not beside"):
        pipeline.tool("natbias-unknown")
    (tmp_path / "elsewhere").mkdir()
    other = tmp_path / "elsewhere" / "natbias-unknown"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert pipeline.tool("natbias-unknown") == [str(other)]


# --- one run's bookkeeping, with stand-ins for fairseq-train -----------------------------


@pytest.fixture
def fake_launchers(monkeypatch, tmp_path):
    """Launchers that print FP16_LOG as fairseq-train would, one that fails
    part way as fairseq does at its minimum loss scale, one that cannot start."""
    log = tmp_path / "fp16.log"
    log.write_text("\n".join(FP16_LOG) + "\n")
    printing = [
        sys.executable,
        "-c",
        "import sys; print(open(sys.argv[1]).read(), end='')",
        str(log),
    ]
    monkeypatch.setitem(gpu_check.LAUNCHERS, "fake", lambda arguments, processes: printing)
    monkeypatch.setitem(
        gpu_check.LAUNCHERS,
        "failing",
        lambda arguments, processes: [
            sys.executable,
            "-c",
            "print('epoch 001: 10 / 103 loss=13.1'); raise SystemExit("
            "'FloatingPointError: Minimum loss scale reached (0.0001).')",
        ],
    )
    monkeypatch.setitem(
        gpu_check.LAUNCHERS,
        "missing",
        lambda arguments, processes: [str(tmp_path / "no-such-dir" / "torchrun"), "--standalone"],
    )
    return printing


def steps_in(work, budget=None, copy_to=None):
    work.mkdir(parents=True, exist_ok=True)
    return report.Steps(work, {}, budget, copy_to, lambda results: json.dumps(sorted(results)))


def test_a_run_is_recorded_then_skipped_and_an_interrupted_one_restarted(
    fake_launchers, tmp_path, capsys
):
    steps, run_dir = steps_in(tmp_path / "work"), tmp_path / "run"
    record = gpu_check.train("fp16 default 1", "fake", ["a"], run_dir, steps, 50)
    assert steps.results["fp16 default 1"] is record
    assert record["overflow_steps"] == 3 and record["loss_scale"]["last"] == 32
    assert record["final_valid_loss"] == 12.5 and len(record["interval_seconds_per_update"]) == 3
    assert (run_dir / "train.log").read_text().splitlines() == FP16_LOG
    written = (run_dir / "train.log").stat().st_mtime_ns

    assert gpu_check.train("fp16 default 1", "fake", ["a"], run_dir, steps, 50) is record
    assert "fp16 default 1: finished before, skipped" in capsys.readouterr().out
    assert (run_dir / "train.log").stat().st_mtime_ns == written

    # Other arguments: run again, from scratch.
    (run_dir / "checkpoint_last.pt").write_text("from the earlier attempt")
    again = gpu_check.train("fp16 default 1", "fake", ["b"], run_dir, steps, 50)
    assert again is not record and again["arguments"] == ["b"]
    assert "removing the earlier attempt" in capsys.readouterr().out
    assert not (run_dir / "checkpoint_last.pt").exists()  # fairseq would have resumed from it
    assert (run_dir / "train.log").read_text().splitlines() == FP16_LOG  # not appended to


def test_a_failed_run_is_recorded_with_its_error_and_tried_again(fake_launchers, tmp_path):
    steps, run_dir = steps_in(tmp_path / "work"), tmp_path / "run"
    record = gpu_check.train("fp16 default 1", "failing", ["a"], run_dir, steps, 50)
    assert record["failed"] == "FloatingPointError: Minimum loss scale reached (0.0001)."
    assert "FAILED: FloatingPointError" in report.run_row("fp16", "default", 1, record, False)
    retried = gpu_check.train("fp16 default 1", "failing", ["a"], run_dir, steps, 50)
    assert retried is not record and "failed" in retried


@pytest.mark.training
def test_a_launcher_that_cannot_start_is_one_line_not_a_traceback(fake_launchers, tmp_path):
    steps = steps_in(tmp_path / "work")
    record = gpu_check.train("torchrun", "missing", ["a"], tmp_path / "run", steps, 50)
    assert record["failed"].startswith("could not start ")
    assert "No such file or directory" in record["failed"]
    line = report.torchrun_line(record, 50, "fp16", "")
    assert "FAILED: could not start" in line and "\n" not in line
    assert "torchrun" in json.loads((tmp_path / "work" / "results.json").read_text())


def test_the_time_budget_leaves_runs_out_and_a_later_call_runs_them(fake_launchers, tmp_path):
    steps, run_dir = steps_in(tmp_path / "work", budget=1000), tmp_path / "run"
    assert gpu_check.train("fp16 default 1", "fake", ["a"], run_dir, steps, 50)["updates"] == 50
    steps.longest = 2000  # a run as long as the longest so far would end after the budget
    left = gpu_check.train("fp16 stock 1", "fake", ["a"], tmp_path / "run2", steps, 50)
    assert left["left_out"] == "--time-budget 1000 s reached"
    assert report.run_row("fp16", "stock", 1, left, False).startswith(
        "| fp16 | stock | 1 | not run: --time-budget 1000 s reached |"
    )
    later = steps_in(tmp_path / "work")
    later.results.update(steps.results)
    assert "left_out" not in gpu_check.train(
        "fp16 stock 1", "fake", ["a"], tmp_path / "run2", later, 50
    )


def test_the_table_is_written_and_copied_after_every_step(fake_launchers, monkeypatch, tmp_path):
    bleu = "Generate test with beam=5: BLEU4 = 1.23, 10.0/2.0/1.0/0.5 (BP=1.000)"
    monkeypatch.setattr(pipeline, "tool", lambda name: [sys.executable, "-c", f"print({bleu!r})"])
    args = gpu_check.parse_args(["--smoke", "--rounds", "1", "--workdir", str(tmp_path / "work")])
    work, out = tmp_path / "work", tmp_path / "out"
    steps = report.Steps(work, {}, None, str(out), lambda results: gpu_check.table(args, results))
    work.mkdir()
    seen = []
    save = steps.save

    def save_and_look():
        table = save()
        assert (work / "gpu_check.md").read_text() == table == (out / "gpu_check.md").read_text()
        seen.append((len(steps.results), table, json.loads((out / "results.json").read_text())))
        return table

    monkeypatch.setattr(steps, "save", save_and_look)
    monkeypatch.setitem(gpu_check.LAUNCHERS, "python", gpu_check.LAUNCHERS["fake"])
    monkeypatch.setitem(gpu_check.LAUNCHERS, "torchrun", gpu_check.LAUNCHERS["fake"])
    done = gpu_check.run_all(args, tmp_path / "data-bin", work, steps)

    assert list(done) == [
        "fp32 default 1",
        "fp32 stock 1",
        "fp32 stock 2",
        "fp32 default 2",
        "fp32 hookoff 1",
        "torchrun",
        "generate",
    ]
    assert [count for count, _, _ in seen] == list(range(1, 8))  # one save per step
    for count, table, results in seen:
        assert len(results) == count
        assert table.count("| CPU smoke |") == min(count, 5)
    assert gpu_check.plan(["fp32"], 0) == [
        ("fp32 default 1", "fp32", "default", 1),
        ("fp32 stock 1", "fp32", "stock", 1),
        ("fp32 hookoff 1", "fp32", "hookoff", 1),
    ]
    assert f"`{bleu}`" in seen[-1][1]
    with tarfile.open(out / "logs.tar.gz") as archive:
        assert "runs/fp32-hookoff-1/train.log" in archive.getnames()


def test_order2_runs_at_fp16_and_bf16_only():
    plan = gpu_check.plan(["fp16", "bf16", "amp"], 0)
    assert [name for name in (n for n, *_ in plan) if "order2" in name] == [
        "fp16 order2 1",
        "bf16 order2 1",
    ]
    options = gpu_check.training_arguments("bin", "run", "order2", "fp16", 300, False, False)
    assert options[options.index("--natbias-order") + 1] == "2"
    assert options[options.index("--arch") + 1] == "transformer_natbias_iwslt_de_en"


@pytest.mark.training
def test_torchrun_and_generate_follow_their_precisions_runs(fake_launchers, monkeypatch, tmp_path):
    """A time budget must cut later precisions' trainings, not these two."""
    monkeypatch.setattr(pipeline, "tool", lambda name: [sys.executable, "-c", "print('BLEU4')"])
    monkeypatch.setitem(gpu_check.LAUNCHERS, "python", gpu_check.LAUNCHERS["fake"])
    monkeypatch.setitem(gpu_check.LAUNCHERS, "torchrun", gpu_check.LAUNCHERS["fake"])
    args = gpu_check.parse_args(["--smoke", "--workdir", str(tmp_path / "work")])
    args.precisions = ["fp32", "fp16"]  # the smoke run's generate reads fp32's checkpoint
    done = gpu_check.run_all(
        args, tmp_path / "data-bin", tmp_path / "work", steps_in(tmp_path / "work")
    )
    assert list(done) == [
        "fp32 default 1",
        "fp32 stock 1",
        "fp32 hookoff 1",
        "torchrun",
        "generate",
        "fp16 default 1",
        "fp16 stock 1",
        "fp16 hookoff 1",
        "fp16 order2 1",
    ]


def test_the_order2_table_compares_with_the_default():
    run = {
        "loss_scale": None,
        "overflow_steps": 0,
        "updates": 300,
        "gain": 1.0,
        "seconds_per_update": 0.05,
        "peak_train_bytes": 2**30,
        "peak_valid_bytes": 2**29,
        "final_valid_loss": 6.0,
        "interval_seconds_per_update": [0.04, 0.04, 0.04],
    }
    slower = dict(
        run,
        interval_seconds_per_update=[0.05, 0.05],
        peak_train_bytes=2**30 * 1.5,
        final_valid_loss=5.5,
    )
    plan = [("bf16 default 1", "bf16", "default", 1), ("bf16 order2 1", "bf16", "order2", 1)]
    table = report.markdown(plan, {"bf16 default 1": run, "bf16 order2 1": slower}, [], [], False)
    assert "| bf16 | 1.250 | 1.500 | 5.500 vs 6.000 |" in table
    assert "| bf16 | default, --natbias-order 2 | 1 |" in table


# --- the script itself, --smoke on the CPU, from a Python without fairseq's scripts ----------


@pytest.fixture(scope="module")
def multi30k_slice(tmp_path_factory):
    return write_multi30k_slice(tmp_path_factory.mktemp("multi30k_slice"), SLICE)


def bare_python(root):
    """A Python whose folder has no fairseq scripts (the .venv's interpreter
    outside the .venv, its packages through PYTHONPATH, as after ``pip
    install --target``) and an environment whose PATH has none."""
    import sysconfig

    base = Path(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable)
    (root / "bin").mkdir(parents=True, exist_ok=True)
    python = root / "bin" / "python3"
    if not python.exists():
        python.symlink_to(base.resolve())
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env.update(
        PYTHONPATH=sysconfig.get_paths()["purelib"],
        PYTHONNOUSERSITE="1",
        PATH=f"{root / 'bin'}:/usr/bin:/bin",
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    return python, env


def run_script(*args, check=True, python=None, env=None):
    env = env or dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [str(python or sys.executable), str(SCRIPT), *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"gpu_check.py failed ({result.returncode}):\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


@pytest.fixture(scope="module")
def smoke(multi30k_slice, tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu_check")
    python, env = bare_python(tmp_path_factory.mktemp("bare"))
    command = [
        "--smoke",
        "--multi30k",
        multi30k_slice,
        "--workdir",
        work,
        "--vocab-size",
        1000,
        "--copy-to",
        work / "out",
    ]
    return work, command, run_script(*command, python=python, env=env), (python, env)


@pytest.mark.training
def test_smoke_runs_from_a_python_without_fairseqs_scripts(smoke):
    work, _, first, (python, env) = smoke
    assert not any(python.parent.glob("fairseq-*")) and not (python.parent / "torchrun").exists()
    for name in ("fairseq-preprocess", "fairseq-generate", "fairseq-train", "torchrun"):
        assert shutil.which(name, path=env["PATH"]) is None
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, importlib.util as u; print(sys.prefix, u.find_spec('fairseq').origin)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    prefix, fairseq_found = probe.stdout.split()
    assert ".venv" not in prefix and ".venv" in fairseq_found  # packages on PYTHONPATH only
    table = (work / "gpu_check.md").read_text()
    assert "torchrun --nproc_per_node=1 (default, fp32, --cpu, 2 updates) [one process" in table
    assert "reached update 2" in table
    assert re.search(
        r"fairseq-generate \(beam 5, --cpu, .*\): `Generate test with beam=5: "
        r"BLEU4 = ",
        table,
    )
    assert (work / "out" / "gpu_check.md").read_text() == table


@pytest.mark.training
def test_smoke_table_names_the_cpu_and_holds_every_run(smoke):
    work, _, first, _ = smoke
    table = (work / "gpu_check.md").read_text()
    assert table in first.stdout
    assert "device: CPU smoke" in table
    rows = table_rows(table)
    assert list(rows) == [
        ("fp32", "default", "1"),
        ("fp32", "stock", "1"),
        ("fp32", "hookoff", "1"),
    ]
    assert all(cells[3] == "CPU smoke" for cells in rows.values())
    assert "fp16, bf16, amp: skipped" in table
    assert "| fp32 | n/a (no loss scaling) |" in table
    for name in ("fp32 default 1", "fp32 stock 1", "fp32 hookoff 1"):  # progress as it goes
        assert f"{name}: update 2/2, loss " in first.stdout
        assert f"{name}: update 2, valid loss " in first.stdout


@pytest.mark.training
def test_smoke_figures_are_those_of_the_logs(smoke):
    work, _, _, _ = smoke
    rows = table_rows((work / "gpu_check.md").read_text())
    results = json.loads((work / "results.json").read_text())
    for (_, arm, index), cells in rows.items():
        log = (work / "runs" / f"fp32-{arm}-{index}" / "train.log").read_text()
        # Read here with plain regular expressions, not the script's reader.
        valid_losses = re.findall(r"\| valid \| .*? \| loss ([\d.]+) \|", log)
        updates = re.findall(r"\| train_inner \| .*num_updates=(\d+)", log)
        assert updates == ["1", "2"]
        assert cells[4] == "2"
        assert cells[14] == f"{float(valid_losses[-1]):.3f}"
        assert cells[9] == str(log.count("overflow detected")) == "0"
        assert not re.search(r"train_inner \|.*[ ,]loss_scale=", log)  # fp32: no scaling
        assert cells[5:9] == ["—"] * 4
        gains = re.findall(r"train_inner \|.*[ ,]gain=([-\d.e]+)", log)
        assert cells[10] == (f"{float(gains[-1]):.3f}" if arm == "default" else "—")
        assert bool(gains) == (arm == "default")  # the hook logs the gain; off, nothing
        assert cells[12:14] == ["n/a", "n/a"]
        record = results[f"fp32 {arm} {index}"]
        assert cells[11] == f"{record['seconds_per_update']:.4f}"
        assert 0 < record["seconds_per_update"] < 60
        assert len(record["interval_seconds_per_update"]) == 1  # update 1 -> 2
    generated = re.search(
        r"Generate test with beam=5: BLEU4 = [^\n]*",
        (work / "generate" / "generate.log").read_text(),
    )[0]
    assert f"`{generated}`" in (work / "gpu_check.md").read_text()


@pytest.mark.training
def test_smoke_second_run_skips_finished_runs(smoke):
    work, command, _, (python, env) = smoke
    logs = sorted((work / "runs").glob("*/train.log"))
    written = [log.stat().st_mtime_ns for log in logs]
    table = (work / "gpu_check.md").read_text()

    again = run_script(*command, python=python, env=env)
    assert "preprocess: " in again.stdout and "exists, skipped" in again.stdout
    for name in ("fp32 default 1", "fp32 stock 1", "fp32 hookoff 1", "torchrun", "generate"):
        assert f"{name}: finished before, skipped" in again.stdout
    assert "updates with python" not in again.stdout
    assert [log.stat().st_mtime_ns for log in logs] == written
    assert (work / "gpu_check.md").read_text() == table


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
