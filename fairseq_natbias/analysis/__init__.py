"""Analysis tools over fairseq's own outputs (training logs, checkpoints,
binarised data, ``fairseq-generate`` output) for Meister et al. (ACL 2023).

One module per tool, each with a console script in ``fairseq_natbias.cli``:

``fairseq_logs``  parse ``fairseq-train`` logs (``--log-format simple``/``json``)
``alc``           area under the validation learning curve (Fig. 3)  natbias-alc
``frequency``     log-probability vs. log-unigram frequency (Fig. 4)  natbias-frequency
``dynamics``      bias and divergence statistics over training (Figs. 1, 5, 13, 14)
                                                                       natbias-dynamics
``runs``          the run-grid layout RUNS/<dataset>/<init>/seed<k>/ and test scores
``report``        test BLEU/chrF and ALC per dataset and init (Figs. 2, 3, 9, 10)
                                                                       natbias-report
``distinct``      distinct-n and n-gram diversity D (Kobayashi et al., 2023) natbias-distinct
``generate_output`` parse ``fairseq-generate`` output
``quality``       sacreBLEU BLEU and chrF with their signatures (torch-free)
``sweep``         generation-time bias scaling / logit adjustment sweep  natbias-sweep
``plots``         matplotlib (Agg) figures shared by the tools
"""


# Bad input to an analysis tool, the message naming the fix; defined on the
# ground floor (fairseq_natbias.errors) so that the checkpoint reader's
# CheckpointError can be one without importing the analysis tools.
from fairseq_natbias.errors import AnalysisError  # noqa: F401
