"""What the OLMo-core tests share (tests/test_olmo_core.py and the gloo
workers of tests/olmo_gloo_worker.py): Multi30k English tokenised here by a
SentencePiece model trained here, written as OLMo-core's numpy token files
(uint16 ids, no header), and OLMo-core's 1M preset trained as OLMo-core
trains it (its AdamW, warm-up and cosine schedule, its Trainer)."""

import gzip
import math

import numpy as np
import torch

VOCAB = 1000  # the SentencePiece model's; the model's output layer is padded to 1024
EOS = 1
SEQUENCE_LENGTH = 64


def write_token_files(source, root, spm_lines: int = 8000) -> dict:
    """train.npy and val.npy under ``root``: Multi30k English (all 29,000
    training sentences; validation's 1,014), each sentence's pieces then EOS,
    from a 1,000-piece unigram SentencePiece model trained on the first
    ``spm_lines`` training sentences."""
    import sentencepiece as spm

    def read(name):
        with gzip.open(source / f"{name}.en.gz", "rt", encoding="utf-8") as f:
            return [line.strip() for line in f]

    train, val = read("train"), read("val")
    (root / "spm.txt").write_text("\n".join(train[:spm_lines]) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(root / "spm.txt"),
        model_prefix=str(root / "spm"),
        vocab_size=VOCAB,
        model_type="unigram",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=EOS,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
        num_threads=1,
    )
    model = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    paths = {}
    for name, lines in (("train", train), ("val", val)):
        ids = np.concatenate([np.array([*p, EOS], dtype=np.uint16) for p in model.encode(lines)])
        paths[name] = root / f"{name}.npy"
        ids.tofile(paths[name])
    return paths


def multi30k_token_files(tmp_path_factory):
    """Multi30k English as OLMo-core token files (:func:`write_token_files`),
    or the test skipped where Multi30k is absent."""
    from natbias_testing import MULTI30K, skip_without_data

    if not (MULTI30K / "train.en.gz").exists():
        skip_without_data(f"Multi30k not found at {MULTI30K} (set NATBIAS_MULTI30K)")
    return write_token_files(MULTI30K, tmp_path_factory.mktemp("olmo_multi30k"))


def tokenizer():
    from olmo_core.data import TokenizerConfig

    return TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=0)


def dataset_config(paths, work_dir, sequence_length: int = SEQUENCE_LENGTH):
    from olmo_core.data import NumpyFSLDatasetConfig

    return NumpyFSLDatasetConfig(
        tokenizer=tokenizer(),
        paths=[str(p) for p in paths],
        sequence_length=sequence_length,
        work_dir=str(work_dir),
    )


def model_1m(meta: bool = True, **kwargs):
    """OLMo-core's olmo2_1M preset for the padded vocabulary (1,024 ids)."""
    from olmo_core.nn.transformer import TransformerConfig

    config = TransformerConfig.olmo2_1M(vocab_size=tokenizer().padded_vocab_size(), **kwargs)
    return config.build(init_device="meta" if meta else "cpu")


def validation_bits(model, path, sequence_length: int = SEQUENCE_LENGTH) -> float:
    """OLMo-core's cross-entropy of ``model`` on the token file, in bits per
    target token (its labels: the ids shifted left)."""
    from olmo_core.data.utils import get_labels

    ids = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
    ids = ids[: ids.numel() // sequence_length * sequence_length].view(-1, sequence_length)
    training = model.training
    model.eval()
    with torch.no_grad():
        loss = model(ids, labels=get_labels({"input_ids": ids})).ce_loss
    model.train(training)
    return loss.item() / math.log(2)


def train_module(model, *, lr=4e-3, warmup=10, steps=100, batch=16, **parallel):
    """OLMo-core's train module for ``model``: its AdamW (weight decay 0.1,
    none on the embeddings, the head's b and gain), linear warm-up then
    cosine (``warmup`` None: a constant rate); ``parallel``: its dp_config / tp_config."""
    from olmo_core.optim import AdamWConfig, CosWithWarmup, OptimGroupOverride
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    no_decay = ["embeddings.weight", "lm_head.w_out.bias", "lm_head.w_out.gain_param"]
    names = {name for name, _ in model.named_parameters()}
    config = TransformerTrainModuleConfig(
        rank_microbatch_size=batch * SEQUENCE_LENGTH,
        max_sequence_length=SEQUENCE_LENGTH,
        optim=AdamWConfig(
            lr=lr,
            weight_decay=0.1,
            group_overrides=[
                OptimGroupOverride(
                    params=[n for n in no_decay if n in names], opts=dict(weight_decay=0.0)
                )
            ],
        ),
        scheduler=None if warmup is None else CosWithWarmup(warmup=warmup),
        **parallel,
    )
    return config.build(model, device=torch.device("cpu"))


def trainer(module, dataset, save_folder, steps, callbacks=(), batch=16, seed=0, **options):
    """OLMo-core's Trainer over ``dataset``, ``steps`` steps of ``batch`` instances."""
    from olmo_core.data import NumpyDataLoaderConfig
    from olmo_core.train import Duration, TrainerConfig

    loader = NumpyDataLoaderConfig(
        global_batch_size=batch * SEQUENCE_LENGTH,
        seed=seed,
        num_workers=0,
        work_dir=str(save_folder) + "-data",
    ).build(dataset, dp_process_group=module.dp_process_group)
    config = TrainerConfig(
        save_folder=str(save_folder),
        save_overwrite=True,
        max_duration=Duration.steps(steps),
        metrics_collect_interval=1,
        cancel_check_interval=10_000,
        device="cpu",
        **options,
    )
    for name, callback in callbacks:
        config = config.with_callback(name, callback)
    return config.build(module, loader)
