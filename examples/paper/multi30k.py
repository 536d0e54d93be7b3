"""Find raw parallel text for the demo and the examples, in this order:

1. a folder given (``--data DIR``, ``DATA=DIR``) holding
   ``{train,val,test_2016_flickr}.{LANG}`` (or ``{train,valid,test}``), plain or
   ``.gz``; anything else is refused in one line naming the fix;
2. ``$NATBIAS_MULTI30K``, checked the same way;
3. Multi30k's public files, downloaded into ``CACHE/download``
   (``$NATBIAS_MULTI30K_URL`` replaces the address);
4. a small synthetic corpus in ``CACHE/synthetic``, announced as such.

The Makefile sets ``NATBIAS_MULTI30K`` to ``../shared/data/multi30k`` when
that folder is there (this project's development machines keep it there).

    python examples/paper/multi30k.py [--data DIR] [--langs de en] CACHE

prints the folder found (progress on stderr), or one error line.
"""

import argparse
import os
import random
import sys
import time
import urllib.request
from pathlib import Path

from natbias.counts import open_text

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# split -> Multi30k's file name (the split's own name is accepted too)
SPLIT_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
LANGS = ("de", "en")


class DataError(ValueError):
    """Raw data that cannot be used; the message names the fix."""


def say(message):
    print(f"[natbias-data {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def expected_files(langs=LANGS) -> str:
    names = ",".join(SPLIT_FILES.values())
    return (
        f"{{{names}}}.{{{','.join(langs)}}}[.gz] (or train/valid/test instead of Multi30k's names)"
    )


def raw_file(folder, split, lang):
    """``folder``'s file of ``split`` (Multi30k's name, the split's own, or any
    file stem such as test_2017_flickr) in ``lang``, plain or .gz; else None."""
    for name in dict.fromkeys((SPLIT_FILES.get(split, split), split)):
        for suffix in (".gz", ""):
            path = Path(folder) / f"{name}.{lang}{suffix}"
            if path.exists():
                return path
    return None


def has_all_files(folder, langs=LANGS):
    return all(raw_file(folder, s, lang) for s in SPLIT_FILES for lang in langs)


def read_lines(path):
    with open_text(path) as handle:
        return [line.strip() for line in handle]


def check_folder(folder, langs=LANGS, name="--data"):
    """DataError naming ``name`` and the fix unless ``folder`` holds every expected file."""
    folder = Path(folder)
    if folder.is_file():
        raise DataError(
            f"{name}={folder} is a file, not a folder: give the folder that "
            f"holds {expected_files(langs)}"
        )
    if not folder.is_dir():
        raise DataError(
            f"{name}={folder}: no such folder; give a folder holding {expected_files(langs)}"
        )
    missing = [
        f"{SPLIT_FILES[s]}.{lang}"
        for s in SPLIT_FILES
        for lang in langs
        if not raw_file(folder, s, lang)
    ]
    if missing:
        raise DataError(
            f"{name}={folder} has no {', '.join(missing)}[.gz]: give a folder "
            f"holding {expected_files(langs)}"
        )


def find_raw_data(given, cache, langs=LANGS, say=say):
    """The folder of raw text to use (see above); downloads go into ``cache``."""
    langs = tuple(langs)
    local = os.environ.get("NATBIAS_MULTI30K")
    for folder, name, found in (
        (given, "--data", "parallel text from {}"),
        (local, "NATBIAS_MULTI30K", "Multi30k from {} (NATBIAS_MULTI30K)"),
    ):
        if folder:
            check_folder(folder, langs, name)
            say("data: " + found.format(folder))
            return Path(folder)
    downloaded = Path(cache) / "download"
    if download_multi30k(downloaded, langs, say):
        return downloaded
    say(
        "data: NO real data found or downloadable; using a small SYNTHETIC corpus "
        "(BLEU on it means nothing about language)"
    )
    return synthetic_corpus(Path(cache) / "synthetic", langs)


def download_multi30k(target, langs=LANGS, say=say):
    """Multi30k's files for ``langs`` into ``target``; False when the download fails."""
    if has_all_files(target, langs):
        say(f"data: Multi30k downloaded before, in {target}")
        return True
    url = os.environ.get("NATBIAS_MULTI30K_URL", MULTI30K_URL)
    if not url.endswith("/"):
        url += "/"
    say(f"data: downloading Multi30k from {url} into {target}")
    target.mkdir(parents=True, exist_ok=True)
    for name in SPLIT_FILES.values():
        for lang in langs:
            path = target / f"{name}.{lang}.gz"
            if path.exists():
                continue
            part = path.with_name(path.name + ".part")
            try:
                with urllib.request.urlopen(f"{url}{name}.{lang}.gz", timeout=20) as response:
                    part.write_bytes(response.read())
                part.replace(path)
            except OSError as error:  # URLError, HTTPError and timeouts are OSErrors
                say(f"data: download failed ({error})")
                part.unlink(missing_ok=True)
                return False
    return True


def synthetic_corpus(target, langs=LANGS):
    """Zipf-distributed made-up words; word i of each language translates to word i."""
    rng = random.Random(0)
    words = {lang: [f"{lang}{i}" for i in range(300)] for lang in langs}
    weights = [1 / (i + 1) for i in range(300)]
    target.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", 6000), ("valid", 300), ("test", 300)):
        ids = [rng.choices(range(300), weights, k=rng.randint(4, 14)) for _ in range(size)]
        for lang in langs:
            lines = [" ".join(words[lang][i] for i in sent) for sent in ids]
            (target / f"{SPLIT_FILES[split]}.{lang}").write_text("\n".join(lines) + "\n")
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="examples/paper/multi30k.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("cache", help="where a download or the synthetic corpus goes")
    parser.add_argument("--data", help="a folder of raw text to check and use as it is")
    parser.add_argument(
        "--langs",
        nargs="+",
        default=list(LANGS),
        help="languages needed, as in the file names (default: de en)",
    )
    parser.add_argument(
        "--prog", help="the program named in an error line (default: this module's)"
    )
    args = parser.parse_args(argv)
    try:
        folder = find_raw_data(args.data, args.cache, args.langs)
    except DataError as error:
        sys.exit(f"{args.prog or parser.prog}: error: {error}")
    print(folder)


if __name__ == "__main__":
    main()
