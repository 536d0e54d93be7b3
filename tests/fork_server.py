"""The one way the tests run a command: fairseq's command-line tools, this
package's console scripts and Python scripts, whether a test runs them
(natbias_testing.fairseq) or a script it runs does (the examples' and
recipes' bash scripts, the demo, torchrun and its ranks), each a process of
its own started in milliseconds instead of seconds.

A fairseq process spends about 3 CPU-seconds importing torch, fairseq and
what fairseq imports (scikit-learn, SciPy) before its first line of work, and
the tests' tiny runs do about a second of work each. So one server process
per test run (shared by its pytest workers) imports fairseq's command-line
modules once; a command the tests run finds, first on its PATH (or as
``sys.executable``: ``served_python``), a small ``fairseq-train`` (and the
others, and ``python``) that hands its command line, working directory,
environment and its stdin, stdout and stderr to the server, which forks a
process that runs the console script's own entry point, or the script
``python`` was given, with them and reports its exit status.

Each command is still a process of its own; the server ran no torch kernel
before the fork and OpenMP starts no thread there (OMP_NUM_THREADS=1), so the
forked process starts clean and sets its own thread count from the command's
OMP_NUM_THREADS. A signal to the small process is passed on; if it dies, the
forked process is stopped. Neither this package nor transformers is imported
by the server: a command imports them as a fresh process does (and reads
the environment it was given first). ``python`` with another option than
-u, -c or -m is the interpreter itself. The server stops when the pytest
run that started it has ended.

``NATBIAS_TESTS_SUBPROCESS=1`` runs the installed scripts instead.

    python fork_server.py NAME OWNER   # the server (started by shim_directory)
"""

import array
import contextlib
import functools
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Imported by the server before it forks: fairseq, then fairseq's tools the
# tests run (but see configures_logging_first). Not this package's: a command
# imports fairseq_natbias itself, as a fresh process does.
PRELOADED = (
    "fairseq-train", "fairseq-generate", "fairseq-preprocess", "fairseq-eval-lm", "fairseq-validate",
)  # fmt: skip
# What a fairseq command imports on its first steps rather than at its start,
# imported before the fork too: torch's compiler (the first construction of a
# torch.optim.Optimizer) and SymPy (the first shape check of torch's
# multi-head attention). About 0.7 CPU-seconds a process.
FIRST_STEP_MODULES = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes")

# What a script runs as ``fairseq-train`` (or ``python``): Python isolated and
# without site (-IS) starts in milliseconds; it needs nothing but the standard library.
SHIM = """#!{python} -IS
import array, json, os, signal, socket, sys
{prelude}
connection = socket.socket(socket.AF_UNIX)
connection.connect({address!r})  # an abstract name: no file
request = dict(argv=argv, cwd=os.getcwd(), env=dict(os.environ), executable=executable,
               unbuffered=unbuffered)
request = json.dumps(request).encode()
streams = array.array("i", [0, 1, 2])
connection.sendmsg([len(request).to_bytes(8, "big") + request],
                   [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])
reply = connection.makefile("rb")
pid = int.from_bytes(reply.read(8), "big")
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, lambda number, _: os.kill(pid, number))
status = reply.read(4)
if len(status) < 4:
    sys.exit(f"{{argv[0]}}: the process ended without an exit status (killed)")
sys.exit(int.from_bytes(status, "big", signed=True))
"""
TOOL_PRELUDE = "argv, executable, unbuffered = sys.argv, None, False"
# ``python [-u] SCRIPT ...``, ``- ...`` (the script on stdin), ``-c CODE ...``
# and ``-m MODULE ...`` are served; the interpreter itself runs anything else
# (another option, the processes multiprocessing spawns), and a script whose
# run depends on what the server's start fixed: its hash seed, its streams'
# encoding, what it imports (-X importtime), its memory allocator.
UNSERVED_ENVIRONMENT = (
    "PYTHONPROFILEIMPORTTIME", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8",
    "PYTHONINSPECT", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONTRACEMALLOC",
)  # fmt: skip
PYTHON_PRELUDE = """argv, executable = sys.argv[1:], sys.argv[0]
unbuffered = argv[:1] == ["-u"]  # as torchrun starts its ranks
script = argv[unbuffered] if argv[unbuffered:] else ""
if script.startswith("-"):
    served = script == "-" or script in ("-c", "-m") and len(argv) > unbuffered + 1
else:
    served = os.path.isfile(script)
# multiprocessing's spawned processes read descriptors they inherit: not passed on here
if not served or "--multiprocessing-fork" in argv or {unserved!r} & set(os.environ):
    os.execv({python!r}, [{python!r}, *argv])
argv = argv[unbuffered:]"""


def shims_enabled():
    return os.environ.get("NATBIAS_TESTS_SUBPROCESS") != "1"


@functools.cache
def served_tools():
    """What the server serves: fairseq's console scripts and this package's."""
    from importlib.metadata import entry_points

    scripts = entry_points(group="console_scripts")
    return frozenset(e.name for e in scripts if e.name.startswith(("fairseq-", "natbias-")))


def serves(tool):
    return tool in served_tools()


_SERVER = {}


def shim_directory(bin_dir):
    """A folder of small ``fairseq-*`` commands served by this test run's
    server (started by the first pytest worker that asks; it stops when the
    run has ended); put it first on a command's PATH. ``bin_dir``: the
    environment whose Python serves."""
    if "dir" not in _SERVER:
        # xdist's workers share the run's id; their parent, the run, outlives them
        worker = "PYTEST_XDIST_WORKER" in os.environ
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID") if worker else None
        name = f"natbias-fork-{run or os.getpid()}"
        folder = Path(tempfile.gettempdir()) / name
        if not server_ready(folder):
            start_server(bin_dir, name, os.getppid() if worker else os.getpid(), folder)
        _SERVER["dir"] = folder / "bin"
    return _SERVER["dir"]


def server_ready(folder):
    """Whether the server of ``folder`` is serving (a crashed run's folder is not)."""
    try:
        return process_alive(int((folder / "ready").read_text()))
    except (OSError, ValueError):
        return False


def start_server(bin_dir, name, owner, folder):
    """Starts a server and waits for the run's server (that one, or another
    worker's that took the name first) to be ready."""
    log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    with open(log, "w") as output:
        server = subprocess.Popen(
            [str(Path(bin_dir) / "python"), str(Path(__file__).resolve()), name, str(owner)],
            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + 120
    while not server_ready(folder):
        if server.poll() not in (None, 0) or time.time() > deadline:
            raise RuntimeError(f"the fork server did not start: {log.read_text()}")
        time.sleep(0.05)
    log.unlink()
    _SERVER["process"] = server  # ended (another worker's took the name) or serving


def served_python(bin_dir):
    """The served ``python``, for scripts that look for fairseq's tools
    beside ``sys.executable`` (examples/paper/pipeline.py's ``tool``)."""
    return shim_directory(bin_dir) / "python"


# --- the server ------------------------------------------------------------------------


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


def receive(connection):
    """The request and the client's three standard streams (descriptors)."""
    header, ancillary, _, _ = connection.recvmsg(8, socket.CMSG_LEN(3 * 4))
    streams = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            streams.frombytes(data[: len(data) - len(data) % 4])
    length, body = int.from_bytes(header, "big"), b""
    while len(body) < length:
        body += connection.recv(length - len(body))
    return json.loads(body), list(streams)


def stop_when_client_dies(connection):
    """The client never writes after its request: end of file means it died."""
    if not connection.recv(1):
        os.kill(os.getpid(), signal.SIGKILL)


def set_path(first, env):
    """sys.path as a new process has it: the script's folder, then PYTHONPATH's."""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [first, *extra]


def run_script(script, env):
    """What ``python SCRIPT`` runs (``python -``: the script on stdin;
    ``-c CODE``; ``-m MODULE``), in a new ``__main__`` as the interpreter makes it."""
    import runpy
    import types

    main = sys.modules["__main__"] = types.ModuleType("__main__")
    if script == "-m":
        set_path(os.getcwd(), env)
        runpy._run_module_as_main(sys.argv.pop(1))  # what the interpreter calls
        return
    if script == "-c":
        folder, filename, source = "", "<string>", sys.argv.pop(1)
    elif script == "-":
        folder, filename, source = "", "<stdin>", sys.stdin.read()
    else:
        folder, filename = os.path.dirname(os.path.realpath(script)), os.path.abspath(script)
        source = Path(filename).read_bytes()  # compile reads an encoding declaration
    if script != "-c":
        main.__file__, main.__cached__ = filename, None
    set_path(folder, env)
    exec(compile(source, filename, "exec"), main.__dict__)


def unbuffered_streams():
    """sys.stdout and sys.stderr as ``python -u`` (or PYTHONUNBUFFERED) makes them."""
    import io

    for name, descriptor in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        raw = io.FileIO(descriptor, "w", closefd=False)
        unbuffered = io.TextIOWrapper(
            raw, encoding=stream.encoding, errors=stream.errors, write_through=True
        )
        setattr(sys, name, unbuffered)


def configures_logging_first(entry):
    """Whether the entry point's module calls logging.basicConfig before it
    imports fairseq, as fairseq_cli/train.py does (its logs: stdout, INFO);
    such a module is imported after the fork, not by the server."""
    import ast
    from importlib.util import find_spec

    source = Path(find_spec(entry.module).origin).read_text(encoding="utf-8")
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom):
            names = [statement.module or ""]
        elif "logging.basicConfig(" in ast.unparse(statement):
            return True
        else:
            continue
        if any(name.split(".")[0] == "fairseq" for name in names):
            return False
    return False


# The logging.basicConfig calls that importing fairseq (one of its model
# modules sets a stderr handler at DEBUG), then each preloaded tool's module,
# made in the server: recorded, not applied, so that the server's root logger
# stays as a process starts with it. A command replays them where its own
# process would make them: a preloaded tool's at its start, anything else's
# when it first imports fairseq.
IMPORT_LOGGING = {}


@contextlib.contextmanager
def basic_configs_recorded(key):
    import logging

    calls = IMPORT_LOGGING.setdefault(key, [])
    original = logging.basicConfig
    logging.basicConfig = lambda **kwargs: calls.append(kwargs)
    try:
        yield
    finally:
        logging.basicConfig = original


def replay_basic_configs(*keys):
    import logging

    for key in keys:
        for kwargs in IMPORT_LOGGING.get(key, ()):
            logging.basicConfig(**kwargs)


def replay_at_first_fairseq_import():
    """fairseq's import-time basicConfig, made when the command first imports
    fairseq (which the server's import left cached)."""
    import builtins

    original = builtins.__import__

    def importing(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.split(".")[0] == "fairseq":
            builtins.__import__ = original
            replay_basic_configs("fairseq")
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = importing


def run_command(connection, entries):
    """In the forked process: the command as its own process would run it."""
    import atexit as exits
    import warnings

    import torch

    code = 1
    try:
        request, streams = receive(connection)
        for target, stream in enumerate(streams):
            os.dup2(stream, target)
            os.close(stream)
        connection.sendall(os.getpid().to_bytes(8, "big"))
        threading.Thread(target=stop_when_client_dies, args=(connection,), daemon=True).start()
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        sys.argv = request["argv"]
        warnings.resetwarnings()
        if env.get("PYTHONWARNINGS"):
            warnings._processoptions(env["PYTHONWARNINGS"].split(","))
        torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count()))
        if request["unbuffered"] or env.get("PYTHONUNBUFFERED"):
            unbuffered_streams()
        if request["executable"]:  # python SCRIPT ...
            sys.executable = request["executable"]
            replay_at_first_fairseq_import()
            code = exit_status(lambda: run_script(sys.argv[0], env))
        else:
            set_path(os.path.dirname(os.path.realpath(sys.argv[0])), env)
            entry = entries[os.path.basename(sys.argv[0])]
            tool = os.path.basename(sys.argv[0])
            if entry.module in sys.modules:  # preloaded: its import, fairseq's first, is done
                replay_basic_configs("fairseq", tool)
            else:
                replay_at_first_fairseq_import()
            code = exit_status(lambda: entry.load()())
        exits._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            connection.sendall(code.to_bytes(4, "big", signed=True))
        finally:
            os._exit(code)


def serve(name, owner):
    from importlib.metadata import entry_points

    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind("\0" + name)  # one server a run: the first to take the name
    except OSError:
        return
    scripts = {e.name: e for e in entry_points(group="console_scripts")}
    entries = {tool: scripts[tool] for tool in served_tools()}
    try:
        with basic_configs_recorded("fairseq"):
            import fairseq  # noqa: F401
        preloaded = PRELOADED
    except ImportError:  # the [hf] extra alone: torch preloaded, natbias's tools and python served
        preloaded = ()
    for tool in preloaded:
        if not configures_logging_first(entries[tool]):
            with basic_configs_recorded(tool):
                entries[tool].load()
    for module in FIRST_STEP_MODULES:
        importlib.import_module(module)
    folder = Path(tempfile.gettempdir()) / name
    shutil.rmtree(folder, ignore_errors=True)
    shims = folder / "bin"
    shims.mkdir(parents=True)
    python = PYTHON_PRELUDE.format(python=sys.executable, unserved=set(UNSERVED_ENVIRONMENT))
    for tool, prelude in [(tool, TOOL_PRELUDE) for tool in entries] + [("python", python)]:
        shim = SHIM.format(python=sys.executable, prelude=prelude, address="\0" + name)
        (shims / tool).write_text(shim)
        (shims / tool).chmod(0o755)
    # What the server imported, frozen: a forked command's collections leave it
    # out instead of walking (and so copying) its 400,000 objects, 0.2
    # CPU-seconds of every fairseq command's configuration alone.
    gc.freeze()
    listener.listen(64)
    (folder / "ready").write_text(str(os.getpid()))
    sys.stdout.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked commands reaped by the kernel
    try:
        while process_alive(owner):
            if not select.select([listener], [], [], 1.0)[0]:
                continue
            connection, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command waits on its own
                run_command(connection, entries)
            connection.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
