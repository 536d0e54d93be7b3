"""examples/paper/multi30k.py in process: the data `make demo` and the
examples find, in its order (a folder given, NATBIAS_MULTI30K, a download,
a synthetic corpus), a mirror standing in for Multi30k's address
(file://), and bad folders refused in one line naming the fix. The examples'
own runs without data are in test_examples.py (a fresh clone, no network)."""

import gzip
import re

import multi30k as data_fetch
import pytest


@pytest.fixture
def no_local_multi30k(tmp_path, monkeypatch):
    """No NATBIAS_MULTI30K (the one way the finder looks for a local copy)."""
    monkeypatch.delenv("NATBIAS_MULTI30K", raising=False)
    monkeypatch.chdir(tmp_path)
    messages = []
    return messages.append, messages


def write_mirror(folder, langs=("de", "en"), skip=()):
    """A tiny Multi30k-named corpus, gzipped, as at Multi30k's address."""
    folder.mkdir()
    for name in ("train", "val", "test_2016_flickr"):
        for lang in langs:
            if f"{name}.{lang}" not in skip:
                with gzip.open(folder / f"{name}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.write(f"{name} {lang} one\n{name} {lang} two\n")


def test_download_from_a_mirror_then_reuse(tmp_path, monkeypatch, no_local_multi30k):
    say, messages = no_local_multi30k
    write_mirror(tmp_path / "mirror")
    monkeypatch.setenv("NATBIAS_MULTI30K_URL", (tmp_path / "mirror").as_uri())
    found = data_fetch.find_raw_data(None, tmp_path / "cache", ("de", "en"), say=say)
    assert found == tmp_path / "cache/download"
    for path in (tmp_path / "mirror").iterdir():
        assert (found / path.name).read_bytes() == path.read_bytes()
    assert data_fetch.read_lines(data_fetch.raw_file(found, "valid", "en")) == [
        "val en one",
        "val en two",
    ]
    monkeypatch.setenv("NATBIAS_MULTI30K_URL", (tmp_path / "gone").as_uri())
    assert data_fetch.find_raw_data(None, tmp_path / "cache", ("de", "en"), say=say) == found
    assert "downloaded before" in messages[-1]


def test_a_failed_download_keeps_complete_files_and_falls_back(
    tmp_path, monkeypatch, no_local_multi30k
):
    say, messages = no_local_multi30k
    write_mirror(tmp_path / "mirror", skip=("test_2016_flickr.en",))
    monkeypatch.setenv("NATBIAS_MULTI30K_URL", (tmp_path / "mirror").as_uri())
    found = data_fetch.find_raw_data(None, tmp_path / "cache", ("de", "en"), say=say)
    assert found == tmp_path / "cache/synthetic"
    assert any("download failed" in m for m in messages)
    assert "SYNTHETIC" in messages[-1]
    downloaded = sorted(p.name for p in (tmp_path / "cache/download").iterdir())
    assert downloaded == sorted(p.name for p in (tmp_path / "mirror").iterdir())  # no .part
    assert data_fetch.has_all_files(found, ("de", "en"))
    train = [
        data_fetch.read_lines(data_fetch.raw_file(found, "train", lang)) for lang in ("de", "en")
    ]
    assert len(train[0]) == len(train[1]) > 1000  # line-aligned


@pytest.mark.parametrize("case", ["file", "missing", "incomplete", "variable"])
def test_bad_data_folders_are_refused(case, tmp_path, monkeypatch, no_local_multi30k):
    say, _ = no_local_multi30k
    write_mirror(tmp_path / "partial", skip=("val.de", "test_2016_flickr.de"))
    given, expected = {
        "file": (tmp_path / "partial/train.de.gz", "is a file, not a folder"),
        "missing": (tmp_path / "absent", "no such folder"),
        "incomplete": (tmp_path / "partial", "has no val.de, test_2016_flickr.de[.gz]"),
        "variable": (None, "NATBIAS_MULTI30K="),
    }[case]
    if case == "variable":
        monkeypatch.setenv("NATBIAS_MULTI30K", str(tmp_path / "partial"))
    with pytest.raises(data_fetch.DataError, match=re.escape(expected)) as raised:
        data_fetch.find_raw_data(given, tmp_path / "cache", ("de", "en"), say=say)
    assert "{train,val,test_2016_flickr}.{de,en}[.gz]" in str(raised.value)  # the fix
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "cache").exists()  # nothing downloaded instead


def test_the_demo_uses_the_same_helper(tmp_path):
    import demo

    (tmp_path / "text").write_text("x\n")
    with pytest.raises(SystemExit, match=r"^demo.py: error: --data=.* is a file, not a folder"):
        demo.find_raw_data(str(tmp_path / "text"), tmp_path)


def test_raw_file_takes_multi30k_names_split_names_and_any_stem(tmp_path):
    """train/valid/test map to Multi30k's names (or the split's own); any
    other stem (a further test set) is looked up as it is; .gz first."""
    for name in ("train.de", "val.de.gz", "val.de", "test.de", "test_2017_flickr.de.gz"):
        (tmp_path / name).write_text("x\n")
    assert data_fetch.raw_file(tmp_path, "train", "de") == tmp_path / "train.de"
    assert data_fetch.raw_file(tmp_path, "valid", "de") == tmp_path / "val.de.gz"
    assert data_fetch.raw_file(tmp_path, "test", "de") == tmp_path / "test.de"
    assert data_fetch.raw_file(tmp_path, "test_2017_flickr", "de") == (
        tmp_path / "test_2017_flickr.de.gz"
    )
    assert data_fetch.raw_file(tmp_path, "test_2018_flickr", "de") is None
    assert data_fetch.raw_file(tmp_path, "train", "en") is None
