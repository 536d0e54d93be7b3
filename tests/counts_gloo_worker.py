"""Counting the targets on gloo processes (tests/test_counting_engine.py):
``python counts_gloo_worker.py FOLDER``. Three processes count as one group
of 3, then the first two as a group of 2: OLMo-core's token files (its rule:
instances of 50, each one's first token no target), a 🤗 Arrow dataset as
``natbias.hf.count_targets`` counts it (without transformers' import), then a
file holding an id outside the vocabulary in the last rank's share only. Each rank writes what it got to
``FOLDER/world<W>-rank<k>.npz``."""

import os
import sys

import numpy as np
import torch.distributed as dist
import torch.multiprocessing as mp


def count_all(folder, world, rank):
    import datasets

    from natbias.counts import count_dataset, count_token_files
    from natbias.errors import NaturalBiasError

    paths = sorted(p.path for p in os.scandir(folder) if p.name.startswith("part"))
    files = count_token_files(paths, "uint16", 1024, instance_length=50, cache=False)
    dataset = datasets.load_from_disk(f"{folder}/arrow")  # what natbias.hf.count_targets calls:
    arrow = count_dataset(dataset, 1024, "input_ids", causal=True, cache=False)
    try:
        count_token_files([f"{folder}/bad.npy"], "uint16", 1000, cache=False)
        error = ""
    except NaturalBiasError as raised:
        error = str(raised)
    np.savez(f"{folder}/world{world}-rank{rank}.npz", files=files, arrow=arrow, error=error)


def run(rank, folder):
    for world in (3, 2):
        if rank >= world:
            break
        store = f"file://{folder}/store{world}"
        dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
        count_all(folder, world, rank)
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1],), nprocs=3)
