"""One training of research/gpu_check.py: fairseq's own ``fairseq-train``
(``fairseq_cli.train.cli_main``) in this process, then one line with the
device, the peak GPU memory of training and of validation, and the versions.

    python research/gpu_check_child.py '["DATA", "--arch", ...]'

Peak memory. fairseq 0.12's ``Trainer.train_step`` reads
``torch.cuda.max_memory_allocated()`` for its ``gb_free`` and then calls
``torch.cuda.reset_peak_memory_stats()`` after every update, so the peak read
once after training covers only what came after the last update (the last
validation and checkpoint save). :class:`PeakMemory` folds the peak into a
running maximum before each of those resets, and keeps validation apart by
wrapping ``fairseq_cli.train.validate``: ``train`` is the highest allocation
outside validation (every update, checkpoint saves), ``valid`` the highest
inside it.

bf16. fairseq 0.12 turns --bf16 into --tpu when it parses the options
(fairseq/options.py), and its TPU path needs torch_xla, so --bf16 cannot train
on a GPU as it is: the parsed options get tpu back as the command line says
(unset), for both arms alike.

This process must be the one that trains (``--distributed-world-size 1``):
the peak memory read here is this process's.
"""

import json
import sys

MARK = "gpu_check child: "


class PeakMemory:
    """Peak allocation by phase (``train``, ``valid``) where the peak is reset
    behind our back: ``cuda`` has ``max_memory_allocated()`` and
    ``reset_peak_memory_stats()`` (torch.cuda, or a stand-in in the tests)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.reset = cuda.reset_peak_memory_stats  # the real one, kept
        self.peaks = {"train": 0, "valid": 0}
        self.phase = "train"

    def fold(self):
        """The peak since the last reset, into the current phase's maximum."""
        self.peaks[self.phase] = max(self.peaks[self.phase], int(self.cuda.max_memory_allocated()))

    def reset_peak_memory_stats(self, *args, **kwargs):
        """What fairseq's Trainer calls after each update: fold, then reset."""
        self.fold()
        return self.reset(*args, **kwargs)

    def around_validation(self, validate):
        """``validate`` with its peak kept as the ``valid`` phase's."""

        def validate_measured(*args, **kwargs):
            self.fold()
            self.reset()
            self.phase = "valid"
            try:
                return validate(*args, **kwargs)
            finally:
                self.fold()
                self.reset()
                self.phase = "train"

        return validate_measured

    def install(self, cuda_module, train_module):
        """Put the folding reset into ``cuda_module`` (torch.cuda: fairseq looks
        it up there at each call) and wrap ``train_module.validate``."""
        cuda_module.reset_peak_memory_stats = self.reset_peak_memory_stats
        train_module.validate = self.around_validation(train_module.validate)

    def finish(self):
        """Both peaks in bytes, the rest since the last reset folded in."""
        self.fold()
        return dict(self.peaks)


def without_implied_tpu(parse, argv):
    """fairseq's parse_args_and_arch, with ``tpu`` as the command line says."""

    def parse_without_implied_tpu(*args, **kwargs):
        parsed = parse(*args, **kwargs)
        parsed.tpu = "--tpu" in argv
        return parsed

    return parse_without_implied_tpu


def main():
    # fairseq_cli.train first: its import sets up fairseq's log format.
    import fairseq_cli.train  # isort: skip
    import fairseq.options  # isort: skip
    import torch

    argv = json.loads(sys.argv[1])
    sys.argv = ["fairseq-train", *argv]
    fairseq.options.parse_args_and_arch = without_implied_tpu(
        fairseq.options.parse_args_and_arch, argv
    )
    on_gpu = torch.cuda.is_available() and "--cpu" not in argv
    memory = PeakMemory(torch.cuda) if on_gpu else None
    if memory:
        memory.install(torch.cuda, fairseq_cli.train)
    fairseq_cli.train.cli_main()

    import fairseq

    peaks = memory.finish() if memory else {}
    print(
        MARK
        + json.dumps(
            {
                "device": torch.cuda.get_device_name() if on_gpu else None,
                "gpus": torch.cuda.device_count(),
                "peak_train_bytes": peaks.get("train"),
                "peak_valid_bytes": peaks.get("valid"),
                "torch": torch.__version__,
                "fairseq": fairseq.__version__,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
