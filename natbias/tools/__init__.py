"""Text-only tools over training logs, scores and raw data (no torch, no
fairseq): log readers, ALC, reports, plots, distinct-n, sacreBLEU scoring,
finding data, SentencePiece, the frequency tools' statistics (``by_frequency``,
``frequency_bias``; their scripts: natbias.tools.frequency), and the console
scripts natbias-alc, -report, -dynamics and -distinct (``cli``)."""
