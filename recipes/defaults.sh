# defaults.sh: every setting of the recipes, each with its default and what it
# does; the one place to change a default.
#
# lib.sh sources this file after a recipe's own lines, and every line here only
# assigns a variable that is still unset: the environment wins over the recipe,
# which wins over these. A recipe (e.g. iwslt14_de_en/run.sh) sets only what
# differs from here, in the same form. The defaults are the IWSLT-size ones
# (~30k-300k pairs); `recipes/<recipe>/run.sh --help` lists them all with the
# values that recipe would use.
#
# [smoke: x] is the value under SMOKE=1 unless given in the environment (it
# wins over the recipe's value too, see smoke_settings in lib.sh); "ours" marks
# choices the paper leaves open (fairseq's usual values for data of this size).

# --- data ----------------------------------------------------------------------
SRC=${SRC-}                             # one-pair recipes (the template): source language, as in the file names
TGT=${TGT-}                             # ... and target language; PAIRS and WORK_DIR follow from the two
PAIRS=${PAIRS-"$SRC-$TGT"}              # directions, SRC-TGT ("$SRC-$TGT $TGT-$SRC" for both)
RAW_DIR=${RAW_DIR-}                     # local raw text instead of the download: RAW_DIR[/<pair>]/<name>.<lang>[.gz]
RAW_TRAIN=${RAW_TRAIN-train}            # <name> of the training text
RAW_VALID=${RAW_VALID-valid}            # <name> of the validation text (early stopping)
RAW_TEST=${RAW_TEST-test}               # <name> of the test text
OOD_TEST=${OOD_TEST-}                   # out-of-domain test (A.5): wmt14 (newstest2014), iwslt14, PATH/<name> prefix, or empty
TRAIN_LINES=${TRAIN_LINES-0}            # first N training pairs only (0: all) [smoke: 3000]
EVAL_LINES=${EVAL_LINES-0}              # first N validation/test pairs only (0: all) [smoke: 50]
CLEAN_MAX_WORDS=${CLEAN_MAX_WORDS-250}  # drop training pairs with a side longer than this (prepare-wmt14en2de.sh)
CLEAN_RATIO=${CLEAN_RATIO-9}            # ... or a length ratio above this (clean-corpus-n.perl's default; 0: no ratio filter)
SPM_MODEL=${SPM_MODEL-}                 # SentencePiece model: a path, afromt (the AfroMT authors'), or empty: train a joint one [smoke: empty]
SPM_VOCAB=${SPM_VOCAB-20480}            # joint vocabulary size when SPM_MODEL is empty (paper, footnote 8: IWSLT's) [smoke: 1000]
SPM_SENTENCES=${SPM_SENTENCES-0}        # sentences SentencePiece trains on (0: all)
WORK_DIR=${WORK_DIR-work/${SRC}_${TGT}} # everything the recipe makes

# --- model and training ------------------------------------------------------------
ARCH=${ARCH-transformer_natbias_iwslt_de_en}  # 6+6 layers, 4 heads, FFN 256 (sec. 4.1, IWSLT), d 256 (ours)
MODEL_ARGS=${MODEL_ARGS-}               # extra model options [smoke: 2+2 layers, d 64, 2 heads]
INITS=${INITS-"unigram zero none"}      # output-bias inits compared (sec. 4.1); stock: fairseq's transformer (ARCH=transformer_natbias)
MULTILINGUAL=${MULTILINGUAL-0}          # 1: one model over all PAIRS (translation_multi_simple_epoch), scored per direction
NATBIAS_PRIOR=${NATBIAS_PRIOR-per-language}  # MULTILINGUAL=1: a bias row per target language (per-language) or one (pooled)
SEEDS=${SEEDS-"1 2 3 4 5"}              # seeds per init (paper: 5) [smoke: 1 2]
LR=${LR-5e-4}                           # peak learning rate (ours: fairseq's IWSLT'14 example) [smoke: 1e-3]
WARMUP=${WARMUP-4000}                   # inverse-sqrt warm-up updates (ours: fairseq's) [smoke: 10]
WEIGHT_DECAY=${WEIGHT_DECAY-0.0001}     # (ours: fairseq's IWSLT'14 example)
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE-4096}  # tokens per update on any hardware (ours: fairseq's example, 1 GPU x 4096) [smoke: 1000]
MAX_TOKENS=${MAX_TOKENS-4096}           # tokens per GPU (or CPU worker) per step [smoke: 1000]
UPDATE_FREQ=${UPDATE_FREQ-}             # steps per update; empty: TOKENS_PER_UPDATE / (MAX_TOKENS x workers), rounded up
MAX_EPOCH=${MAX_EPOCH-100}              # upper bound on epochs (0: none); early stopping ends runs sooner [smoke: 0 = none]
MAX_UPDATE=${MAX_UPDATE-0}              # upper bound on updates (0: none) [smoke: 30]
PATIENCE=${PATIENCE-10}                 # stop after N validations without a better BLEU (ours; MULTILINGUAL=1: loss)
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES-0}  # also validate and save every N updates (0: once per epoch) [smoke: 0]
LOG_INTERVAL=${LOG_INTERVAL-100}        # training log every N updates [smoke: 5]
FP16=${FP16-1}                          # mixed precision on GPUs (1/0)
TRAIN_ARGS=${TRAIN_ARGS-}               # extra fairseq-train options, given last
EXTERNAL_TEXT=${EXTERNAL_TEXT-}         # A.7: add --natbias-init file runs, counted on this raw text ({lang}: TGT) or c4[:N] (N C4 English shards)
UNIGRAM_REG_WEIGHT=${UNIGRAM_REG_WEIGHT-}     # A.4: lambda; when set, add <init>-unireg runs
UNIGRAM_REG_UPDATES=${UNIGRAM_REG_UPDATES-4000}  # A.4: regularised updates before the standard objective (ours)
UNIGRAM_REG_INITS=${UNIGRAM_REG_INITS-none}   # A.4: inits it is tried with
UNIGRAM_LS_INITS=${UNIGRAM_LS_INITS-}       # add <init>-unigram-ls runs: label smoothing towards the unigram (docs/criteria.md), for these inits

# --- evaluation ------------------------------------------------------------------------
BEAM=${BEAM-5}                          # beam size for validation BLEU and test (sec. 4.1)
LENPEN=${LENPEN-1}                      # 1: beam scores divided by length, i.e. length-normalised (sec. 4.1)
MAX_LEN_A=${MAX_LEN_A-0}                # decode at most MAX_LEN_A x source length + MAX_LEN_B tokens [smoke: 1.2]
MAX_LEN_B=${MAX_LEN_B-200}              # (fairseq's defaults, validation and test alike) [smoke: 10]

# --- hardware ---------------------------------------------------------------------------
NGPUS=${NGPUS-}                         # GPUs per node; empty: all visible; 0: CPU [smoke: 0]
NNODES=${NNODES-1}                      # nodes (GPUs only)
NODE_RANK=${NODE_RANK-0}                # this node's rank, 0..NNODES-1
MASTER_ADDR=${MASTER_ADDR-127.0.0.1}    # node 0's address
MASTER_PORT=${MASTER_PORT-}             # node 0's port; empty: a free one (1 node) or 29500
CPU_WORKERS=${CPU_WORKERS-1}            # training processes when NGPUS=0 (gloo)

# --- what to run ---------------------------------------------------------------------------
STEPS=${STEPS-"prepare train evaluate report"}  # any of these, in this order
GRID_TASK=${GRID_TASK-}                 # only the k-th run of the grid, 0-based (job arrays)
RUNS_NAME=${RUNS_NAME-runs}             # runs go to WORK_DIR/<pair>/RUNS_NAME/<init>/seed<k>
SMOKE=${SMOKE-0}                        # 1: the same steps, tiny, on CPU
