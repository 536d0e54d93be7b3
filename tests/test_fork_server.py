"""tests/fork_server.py, which serves fairseq's tools and ``python`` to the
scripts the tests run: a command gives what the installed script gives
(output, exit status), a script runs as the interpreter runs it, and a
command whose caller dies is stopped."""

import os
import signal
import socket
import subprocess
import sys

import fork_server
import pytest
from natbias_testing import BIN

pytestmark = pytest.mark.skipif(
    not fork_server.shims_enabled(), reason="NATBIAS_TESTS_SUBPROCESS=1: no fork server"
)


def run(command, env, **options):
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, **options)


@pytest.fixture(scope="module")
def env():
    shims = fork_server.shim_directory(BIN)
    return dict(
        os.environ, PATH=f"{shims}{os.pathsep}{os.environ['PATH']}", PYTHONWARNINGS="ignore"
    )


def test_a_served_command_prints_and_exits_as_the_installed_script(env, tmp_path):
    bad = ["/no/data", "--arch", "transformer", "--no-such-option"]
    served = run(["fairseq-train", *bad], env)
    installed = run([str(BIN / "fairseq-train"), *bad], env)
    assert served.returncode == installed.returncode == 2
    assert served.stderr.splitlines()[-1] == installed.stderr.splitlines()[-1]
    assert "unrecognized arguments: --no-such-option" in served.stderr
    helped = run(["bash", "-c", "fairseq-preprocess --help | head -1"], env)
    assert helped.stdout.startswith("usage: fairseq-preprocess")


# What a script sees of how it was started, and whether torch was imported before it.
PROBE = """\"\"\"The probe.\"\"\"
import sys
print(__name__, globals().get("__file__"), __doc__, sys.argv, sys.path[0], sys.executable)
print("torch" in sys.modules, file=sys.stderr)
sys.exit(3)
"""


def test_a_served_script_runs_as_the_interpreter_runs_it(env, tmp_path):
    """From a file (through a link: sys.path[0] is the file's folder; -u, as
    torchrun starts ranks), from stdin, -c and -m: what the script sees is
    what the interpreter gives it, but ``sys.executable``, the served
    ``python``; another option (-I), or a process multiprocessing spawns,
    is the interpreter's own."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "probe.py").write_text(PROBE)
    (tmp_path / "link.py").symlink_to(tmp_path / "scripts" / "probe.py")
    served_python = str(fork_server.served_python(BIN))
    for argv, stdin in (
        (["link.py", "a b"], None),
        (["-u", "link.py"], None),
        (["-", "c"], PROBE),
        (["-c", PROBE, "d"], None),
        (["-m", "scripts.probe", "e"], None),
    ):
        served = run(["python", *argv], env, cwd=tmp_path, input=stdin)
        itself = run([sys.executable, *argv], env, cwd=tmp_path, input=stdin)
        assert served.returncode == itself.returncode == 3, served.stderr
        assert served.stdout == itself.stdout.replace(sys.executable, served_python)
        assert (served.stderr, itself.stderr) == ("True\n", "False\n")  # served: forked
    imports = "import sys; print('torch' in sys.modules)"
    for argv in (["-I", "-c", imports], ["-c", imports, "--multiprocessing-fork"]):
        assert run(["python", *argv], env).stdout == "False\n"


def test_a_command_whose_caller_dies_is_stopped(env, tmp_path):
    """A rank waiting for its rendezvous (this test's socket) is stopped when
    the command that asked for it is killed: its connection closes."""
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen(1)
        store.settimeout(60)
        port = store.getsockname()[1]
        command = [
            "fairseq-train", str(tmp_path), "--arch", "transformer", "--task", "language_modeling",
            "--distributed-world-size", "2", "--distributed-rank", "1", "--distributed-no-spawn",
            "--distributed-backend", "gloo", "--distributed-init-method", f"tcp://127.0.0.1:{port}",
        ]  # fmt: skip
        caller = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            rank, _ = store.accept()  # the served process is running
            caller.send_signal(signal.SIGKILL)
            caller.wait()
            rank.settimeout(30)
            while rank.recv(4096):  # until the served process's end closes it
                pass
        finally:
            caller.kill()
