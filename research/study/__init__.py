"""The learning-efficiency study (research/study_learning_efficiency.py,
the command line and its --help) in three parts, each a separate idea:

``study.arms``
    what is compared, under which settings: the arms (stock, WINIT/BIAS,
    gain@G0,C/BIAS; the names of earlier runs' records), the learning-rate
    schedules, the --preset sizes, the two tasks (Translation,
    LanguageModel) and their fairseq options, the --converge options and
    the --train-pairs data size;
``study.runs``
    running them: fairseq-train's arguments, one run from start to test
    score (resuming an interrupted run), the whole plan side by side, and the run records
    a summary reads (kept under --results/runs/);
``study.summary``
    summarising the finished runs: means over seeds, the Markdown tables,
    updates to reach stock by horizon, differences between arms, and the
    plots.

research/ is put on sys.path by the script (as by combine_seeds.py), so
the package is imported as ``study``.
"""

import sys
from pathlib import Path

# study.arms and study.runs build on make demo's pipeline (examples/paper): on
# the path for every script that imports the study (head_start_at_best.py,
# reach_from_records.py, combine_seeds.py), not only for the study's own.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "paper"))
