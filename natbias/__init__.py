"""natbias: the natural bias of Meister et al., "A Natural Bias for Language
Generation Models" (ACL 2023), for any PyTorch model.

The final layer of a language generator computes (the paper's eq. 1)

    p(y | y_<t) = softmax(W phi(y_<t) + b)_y  ∝  p_Wphi(y | y_<t) * p_b(y)    (4)

and the natural bias starts b as the log-unigram distribution of the target
training data, so that a fresh model predicts the unigram and ``W phi``
learns the rest. This package holds what is true in any framework (torch and
numpy only); the engines' adapters are built on it. Each module and what it
owns: docs/design.md.
"""

__version__ = "2.2.0"

# The format of what a saved model records about its natural bias (fairseq
# checkpoints and transformers configurations alike). Version 1 is the first;
# 2 (natbias 2.1) keeps the gain and the bigram weight of shape (1,), not 0-d,
# so that they can be sharded (natbias.legacy_scalars reads version 1); 3
# (natbias 2.2) may hold one bias row per target language (fairseq's
# --natbias-prior per-language), which 2.1 would misread: it refuses format 3.
FORMAT_VERSION = 3
