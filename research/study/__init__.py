"""The learning-efficiency study behind research/study_learning_efficiency.py
(the command line and its --help), in three parts, each module's docstring
saying what it holds: ``study.arms`` (what is compared, under which
settings), ``study.runs`` (running them, and their records) and
``study.summary`` (the tables and plots). Scripts put research/ on sys.path
and import it as ``study``.
"""

import argparse
import os
import sys
from pathlib import Path

# study.arms and study.runs build on make demo's pipeline (examples/paper), and
# study.summary takes "updates to reach" from the transformers examples' report
# (examples/huggingface): on the path for every script that imports the study
# (head_start_at_best.py, reach_from_records.py, combine_seeds.py), not only for
# the study's own.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path[:0] = [str(EXAMPLES / "paper"), str(EXAMPLES / "huggingface")]


def parser_for(doc: str) -> argparse.ArgumentParser:
    """A study script's command line: its docstring as --help, and --multi30k
    (the data; NATBIAS_MULTI30K, else ../shared/data/multi30k)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--multi30k", default=os.environ.get("NATBIAS_MULTI30K", "../shared/data/multi30k")
    )
    return parser
