"""Several fairseq processes from one import: ``python forked_cli.py SPEC``
imports fairseq's command-line modules once, then forks one process per
command of SPEC, each running that console script's own entry point with its
sys.argv, its output in a file. All run side by side (the ranks of one
distributed run must); the launcher exits with the first failure's code.

A fairseq process spends about 3 CPU-seconds importing torch, fairseq and
what fairseq imports (scikit-learn, SciPy) before its first line of work: the
13 processes of tests/test_scale_out.py paid that 13 times. Forked, each is
still a process of its own (its own ranks, sockets and state), started after
the import: nothing ran a torch kernel before the fork, and OMP_NUM_THREADS=1
keeps OpenMP from starting threads, so the children start clean. When one
fails, the others are stopped (ranks would wait for it).

SPEC (JSON): [{"argv": [tool, ...], "output": path}], run in the launcher's
working directory and environment.
"""

import importlib
import json
import os
import signal
import sys
from importlib.metadata import entry_points

# What a fairseq command imports on its first steps rather than at its start,
# imported before the fork too: torch's compiler (the first construction of a
# torch.optim.Optimizer) and SymPy (the first shape check of torch's
# multi-head attention). About 0.7 CPU-seconds a process.
FIRST_STEP_MODULES = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes")


def import_first_step_modules():
    for name in FIRST_STEP_MODULES:
        importlib.import_module(name)


def exit_status(entry):
    """Runs a console script's entry point and returns the status its own
    process would exit with, printing what the interpreter would: a
    SystemExit's message, or an uncaught error through sys.excepthook."""
    try:
        entry()
    except SystemExit as done:
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def run_child(argv, output, entry):
    """In the forked child: argv's console script, stdout and stderr into output."""
    code = 1
    try:
        with open(output, "w") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        sys.argv = list(argv)
        code = exit_status(entry)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(spec_path):
    commands = json.load(open(spec_path))
    scripts = {e.name: e for e in entry_points(group="console_scripts")}
    entries = [scripts[command["argv"][0]].load() for command in commands]
    import_first_step_modules()
    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    for command, entry in zip(commands, entries):
        pid = os.fork()
        if pid == 0:
            run_child(command["argv"], command["output"], entry)
        children.append(pid)
    failed = 0
    while children:  # a failed rank leaves its peers waiting on it: they are stopped
        pid, status = os.wait()
        children.remove(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            failed = code
            for other in children:
                os.kill(other, signal.SIGKILL)
    sys.exit(failed)


if __name__ == "__main__":
    main(sys.argv[1])
