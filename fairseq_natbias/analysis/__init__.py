"""Analysis tools that load fairseq models: ``frequency`` (the paper's Fig. 4),
``decomposition`` (eq. 4), ``sweep`` and ``sweep_lm`` (the bias controlled at generation)."""
