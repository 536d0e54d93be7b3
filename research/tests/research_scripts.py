"""The research scripts, imported as modules by their tests (research/ is no package)."""

import importlib.util
from pathlib import Path

RESEARCH = Path(__file__).resolve().parents[1]


def benchmark_script(name):
    """research/<name>.py imported as a module."""
    spec = importlib.util.spec_from_file_location(name, RESEARCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
