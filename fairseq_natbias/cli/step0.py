r"""natbias-step0: how far a freshly built model is from the unigram (Fig. 1 at
update 0). Takes fairseq-train's arguments, builds the task and model as it
does, and reports on the validation split, in bits per target token:

    nll          the model's validation NLL before any update
    unigram_ce   cross-entropy of the validation targets under the smoothed
                 training unigram (what a model that predicts the unigram gets)
    kl_unigram   mean KL(p_theta(.|y_<t) || unigram)

    natbias-step0 data-bin --user-dir fairseq_natbias --arch transformer_natbias \
        --share-all-embeddings --natbias-init unigram
"""

import json
import sys

from fairseq_natbias.in_process import build_from_training_args, validation_divergence
from natbias.errors import NaturalBiasError


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    try:
        cfg, task, model = build_from_training_args(argv)
        result = validation_divergence(task, model, split=cfg.dataset.valid_subset.split(",")[0])
    except NaturalBiasError as error:
        sys.exit(f"natbias-step0: error: {error}")
    print(json.dumps({key: round(value, 4) for key, value in result.items()}))


if __name__ == "__main__":
    main()
