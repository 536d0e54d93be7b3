"""fairseq_natbias: the natural (log-unigram) output bias of Meister et al.
(ACL 2023) as a fairseq plugin.

    fairseq-train DATA --user-dir fairseq_natbias --arch transformer_natbias ...
    fairseq-train LM-DATA --task language_modeling --user-dir fairseq_natbias \
        --arch transformer_lm_natbias ...
"""

import importlib
import os
import sys

__version__ = "0.8.0"

# The modules whose import registers something with fairseq (the two
# architectures and their models, the two criteria), and the two compatibility
# shims every process that loads a checkpoint needs. fairseq's registries fill
# as these modules are imported, which is how --user-dir works.
REGISTERED_MODULES = ("checkpoint_loading", "numpy_compat", "transformer_lm_natbias",
                      "transformer_natbias", "unigram_label_smoothed_cross_entropy",
                      "unigram_regularized_cross_entropy")
# Programs that use only the package's text helpers (log and score readers,
# SentencePiece, finding the data): a process started as one of them skips the
# registration, so it starts without torch or fairseq (about 5 s on a
# laptop-class CPU; the recipes and examples call these helpers many times).
# Any other process, fairseq's own CLIs with --user-dir included, registers on
# import; a script of one's own can call register() itself.
TEXT_ONLY_PROGRAMS = frozenset({
    "natbias-alc", "natbias-dynamics", "natbias-report",  # console scripts
    "natbias_tools.py",  # recipes/natbias_tools.py, which recipes/lib.sh calls
    "spm_text.py",  # examples/translation/spm_text.py
    "fairseq_natbias.data_fetch",  # python -m, as examples/common.sh runs it
    # Orchestrators that run fairseq in subprocesses only: natbias-demo (and
    # `make demo`'s python -m), and two benchmark scripts (gpu_check.py
    # imports torch itself, to look for a GPU, but not fairseq).
    "natbias-demo", "fairseq_natbias.cli.demo",
    "gpu_check.py", "study_learning_efficiency.py",
})


def plugin_dir() -> str:
    """This package's directory: the ``--user-dir`` to give fairseq from a
    process that has already imported ``fairseq_natbias`` (fairseq refuses a
    second copy of a user module under the same name)."""
    return os.path.dirname(os.path.abspath(__file__))


def register():
    """Register the architectures, models and criteria with fairseq (import
    them); a second call does nothing."""
    try:
        import fairseq  # noqa: F401
    except ImportError as error:  # pragma: no cover - exercised by hand
        raise ImportError(
            "fairseq_natbias needs fairseq, which is not installed. Install it with\n"
            "    pip install --no-deps ve-fairseq==0.12.3\n"
            "    pip install hydra-core omegaconf bitarray regex sacrebleu cython "
            "cffi scikit-learn tqdm packaging\n"
            "or run `make install` in the fairseq-natbias repository."
        ) from error
    for name in REGISTERED_MODULES:
        importlib.import_module(f"{__name__}.{name}")


def started_as() -> str:
    """The program this process was started as: the script's file name, or
    the module of ``python -m MODULE``."""
    if not sys.argv:
        return ""
    if sys.argv[0] == "-m":  # python -m: argv[0] reads "-m" while MODULE's packages import
        argv = getattr(sys, "orig_argv", [])
        return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    return os.path.basename(sys.argv[0])


if started_as() not in TEXT_ONLY_PROGRAMS:
    register()
