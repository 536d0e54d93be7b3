"""Is a folder of wheels (``make gpu-prep``'s gpu_prep/wheels) all that the
GPU machine lacks to run research/gpu_check.py?

    python research/gpu_check_wheels.py gpu_prep/wheels
    PYTHONPATH=SITE python3.12 research/gpu_check_wheels.py --imports

The GPU machine (the tool library's device README and KINDS.md) runs its own
CPython 3.12 on x86-64 Linux with torch and many packages (MACHINE_HAS, the
list KINDS.md gives, read 2026-11-17), has no internet, and installs carried
wheels with ``pip install --no-index --no-deps --target``, which checks
nothing. So this does, here: each wheel installs on CPython 3.12 x86-64
Linux (glibc 2.28 at most), there is one version of each package, and every
requirement (Requires-Dist, markers evaluated for CPython 3.12 on Linux,
extras left out) of each wheel and of this package's own (pyproject.toml's
[project] dependencies) is met by a wheel of the folder (version checked) or by a
package of the machine (name only: their versions are not all known). Exit
status 1, with what is missing, when not.

``--imports``, with the wheels installed in SITE by a CPython 3.12 (and
PyYAML, numpy and packaging, which the machine has): imports what needs no torch
(hydra, omegaconf, antlr4, bitarray, cffi) and loads fairseq's compiled
libbleu and data_utils_fast (numpy's C API); ``import fairseq`` needs
torch, which the GPU machine has: without it here, that is said, not counted
as a failure.
"""

import re
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
# What the GPU check imports that is not this package: fairseq 0.12's build.
NEEDED = ["ve-fairseq==0.12.3"]
MACHINE_PYTHON = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
MAX_GLIBC_MINOR = 28
# The packages of the GPU machines' image 'cuda', as KINDS.md lists them.
MACHINE_HAS = frozenset(
    name.lower()
    for name in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()
)


def canonicalize_name(name):
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def Requirement(text):
    from packaging.requirements import Requirement

    return Requirement(text)


def parse_wheel_filename(name):
    from packaging.utils import parse_wheel_filename

    return parse_wheel_filename(name)


def installs_on_machine(tags):
    """Whether one of a wheel's tags fits CPython 3.12, x86-64 Linux, glibc <= 2.28."""
    for tag in tags:
        platform = re.fullmatch(r"manylinux(?:1|2010|2014|_2_(\d+))_x86_64", tag.platform)
        fits_platform = tag.platform == "any" or (
            platform is not None and int(platform[1] or 17) <= MAX_GLIBC_MINOR
        )
        if (
            tag.interpreter in ("cp312", "py3", "py312")
            and tag.abi in ("cp312", "abi3", "none")
            and fits_platform
        ):
            return True
    return False


def wheel_requirements(path):
    """The Requires-Dist of a wheel's METADATA."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(archive.read(name).decode("utf-8"))
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def this_package_requirements(pyproject=REPO / "pyproject.toml"):
    """pyproject.toml's [project] dependencies with the [fairseq] extra (what the
    plugin runs on; the other extras left out)."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    dependencies = project["dependencies"] + project["optional-dependencies"]["fairseq"]
    return [Requirement(text) for text in dependencies]


def applies(requirement):
    return requirement.marker is None or requirement.marker.evaluate(MACHINE_PYTHON)


def check(folder, needed=None, machine=MACHINE_HAS):
    """(lines to print, problems): the wheels of ``folder`` against ``needed``
    (requirements) and their own requirements."""
    needed = (
        [Requirement(r) for r in NEEDED] + this_package_requirements()
        if needed is None
        else [Requirement(r) for r in needed]
    )
    wheels = sorted(Path(folder).glob("*.whl"))
    lines, problems, versions = [], [], {}
    for path in wheels:
        name, version, _, tags = parse_wheel_filename(path.name)
        versions.setdefault(name, []).append(version)
        fits = installs_on_machine(tags)
        lines.append(
            f"{path.name}: {'installs on' if fits else 'DOES NOT install on'} "
            "CPython 3.12 x86-64 Linux"
        )
        if not fits:
            problems.append(f"{path.name} does not install on CPython 3.12 x86-64 Linux")
    problems += [
        f"{name}: {len(found)} versions ({', '.join(map(str, found))}): keep one"
        for name, found in versions.items()
        if len(found) > 1
    ]
    wanted = [(requirement, "needed") for requirement in needed]
    wanted += [
        (requirement, parse_wheel_filename(path.name)[0])
        for path in wheels
        for requirement in wheel_requirements(path)
    ]
    for requirement, by in wanted:
        if not applies(requirement):
            continue
        name = canonicalize_name(requirement.name)
        if name in versions:
            ok = [v for v in versions[name] if requirement.specifier.contains(v, prereleases=True)]
            where = f"wheel {name} {versions[name][0]}"
            if not ok:
                problems.append(f"{requirement} (for {by}): the wheel is {versions[name][0]}")
                continue
        elif name in machine:
            where = "the machine"
        else:
            problems.append(f"{requirement} (for {by}): neither a wheel nor on the machine")
            continue
        lines.append(f"{requirement} (for {by}): {where}")
    return lines, problems


IMPORTS = ("omegaconf", "hydra", "antlr4", "bitarray", "cffi", "pycparser")
# fairseq's compiled modules that need no torch (data_utils_fast needs numpy).
COMPILED = ("libbleu", "data.data_utils_fast")


def import_check():
    """Problems importing the installed wheels' packages with this Python."""
    import importlib
    import importlib.machinery
    import importlib.util

    problems = []
    print(f"Python {sys.version.split()[0]} at {sys.executable}")
    for name in IMPORTS:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - reported, whatever it is
            problems.append(f"import {name}: {type(error).__name__}: {error}")
        else:
            print(f"import {name}: {getattr(module, '__version__', '')} from {module.__file__}")
    for name in ("yaml", "numpy", "packaging"):  # the machine's own, stood in for here
        module = importlib.util.find_spec(name)
        print(f"(the machine's {name}: {'found' if module else 'NOT found'} here)")
    spec = importlib.util.find_spec("fairseq")  # finds, does not import
    if spec is None:
        return problems + ["fairseq: not installed"]
    for name in COMPILED:
        found = sorted(Path(spec.origin).parent.glob(f"{name.replace('.', '/')}.cpython-*.so"))
        if not found:
            problems.append(f"fairseq: no compiled {name} for this Python")
            continue
        loader = importlib.machinery.ExtensionFileLoader(f"fairseq.{name}", str(found[0]))
        try:
            loader.create_module(importlib.util.spec_from_loader(f"fairseq.{name}", loader))
        except Exception as error:  # noqa: BLE001 - reported, whatever it is
            problems.append(f"fairseq's {found[0].name}: {type(error).__name__}: {error}")
        else:
            print(f"fairseq's compiled {found[0].name}: loads")
    try:
        import fairseq  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name != "torch":
            problems.append(f"import fairseq: {error}")
        else:
            print(
                "import fairseq: not checked, it needs torch, which this Python lacks "
                "(the GPU machine has it)"
            )
    else:
        sys.path.insert(0, str(REPO))
        import fairseq_natbias  # noqa: F401

        print(f"import fairseq {fairseq.__version__} and fairseq_natbias: ok")
    return problems


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--imports"]:
        problems = import_check()
        if problems:
            raise SystemExit("gpu_check_wheels: " + "; ".join(problems))
        return
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        raise SystemExit("usage: gpu_check_wheels.py FOLDER_OF_WHEELS")
    lines, problems = check(argv[0])
    print("\n".join(lines))
    if problems:
        raise SystemExit("gpu_check_wheels: MISSING OR WRONG:\n  " + "\n  ".join(problems))
    print(f"gpu_check_wheels: {argv[0]} holds every package the GPU machine lacks")


if __name__ == "__main__":
    main()
