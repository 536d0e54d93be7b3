"""fairseq-natbias: the natural (log-unigram) output bias as a fairseq plugin.

fairseq itself is not listed: both repackages that install on Python 3.11
(ve-fairseq, fairseq-fixed) declare torchaudio, which text never needs and
which pulls in a different multi-GB torch. `make install` installs
`ve-fairseq==0.12.3 --no-deps` plus the runtime needs listed here; into an
environment that already has fairseq, `pip install --no-deps` this package
(docs/installation.md).

python_requires: what is tested. The fairseq 0.12 builds that install on
current Python (ve-fairseq 0.12.3) ship wheels for CPython 3.11 and 3.12 only;
the official fairseq 0.12.2 does not install on 3.11 and was never tried on
3.10 with this package.
"""

from setuptools import find_packages, setup

FAIRSEQ_RUNTIME = [
    "hydra-core>=1.3.2",
    "omegaconf",
    "bitarray",
    "regex",
    "cython",
    "cffi",
    "scikit-learn",  # imported by fairseq.tasks.audio_classification at import time
    "tqdm",
    "packaging",
]

setup(
    name="fairseq-natbias",
    version="0.8.0",
    description="Log-unigram output-bias initialisation for fairseq (Meister et al., ACL 2023)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    author="the fairseq-natbias authors",
    license="MIT",
    license_files=["LICENSE"],
    python_requires=">=3.11,<3.13",
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Text Processing :: Linguistic",
    ],
    packages=find_packages(include=["fairseq_natbias", "fairseq_natbias.*"]),
    install_requires=[
        "torch>=2.0",
        "numpy",
        "sentencepiece",
        "sacrebleu>=2.0",
        "matplotlib",
    ]
    + FAIRSEQ_RUNTIME,
    extras_require={"test": ["pytest"]},
    entry_points={
        "console_scripts": [
            "natbias-count=fairseq_natbias.cli.count:main",
            "natbias-step0=fairseq_natbias.cli.step0:main",
            "natbias-demo=fairseq_natbias.cli.demo:main",
            "natbias-alc=fairseq_natbias.cli.alc:main",
            "natbias-frequency=fairseq_natbias.cli.frequency:main",
            "natbias-dynamics=fairseq_natbias.cli.dynamics:main",
            "natbias-report=fairseq_natbias.cli.report:main",
            "natbias-sweep=fairseq_natbias.cli.sweep:main",
            "natbias-lm-sweep=fairseq_natbias.cli.sweep_lm:main",
            "natbias-distinct=fairseq_natbias.cli.distinct:main",
            "natbias-average-checkpoints=fairseq_natbias.cli.average_checkpoints:main",
        ]
    },
)
