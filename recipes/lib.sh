# lib.sh: the functions every fairseq-natbias recipe sources.
#
# A recipe (e.g. iwslt14_de_en/run.sh) sets what it changes of defaults.sh,
# then sources this file with its arguments, then calls `run_recipe`. This file
# sources defaults.sh (every setting with its default: the one place to read
# them; SMOKE=1 shrinks some, see smoke_settings) and answers `run.sh --help`.
# Nothing else here sets a default for a recipe setting.
#
# Layout under WORK_DIR (every step skips itself when its output is complete):
#   download/                  what fetch_* downloaded
#   corpus/<l1>-<l2>/raw/      staged text {train,valid,test,ood}.<lang>
#   corpus/<l1>-<l2>/spm/      SentencePiece model and encoded text
#   <src>-<tgt>/data-bin/      fairseq-preprocess output (split test1: OOD test)
#   <src>-<tgt>/runs/<init>/seed<k>/   checkpoints, train.log, test.hyp,
#                              test.bleu.json, test.chrf.json (ood.* likewise)
#   <src>-<tgt>/results.md     BLEU/chrF over inits, mean ± standard error
# MULTILINGUAL=1 trains one model over PAIRS instead, under multilingual/:
#   multilingual/spm/          one SentencePiece model, each corpus encoded
#   multilingual/data-bin/     one dictionary, every pair binarised
#   multilingual/runs/<init>/seed<k>/   checkpoints, train.log
#   multilingual/<src>-<tgt>/  runs/<init>/seed<k>/test.* and results.md, per direction

NATBIAS_RECIPES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NATBIAS_REPO=$(dirname "$NATBIAS_RECIPES")
# The recipe that sourced this file: --help reads its settings' comments.
NATBIAS_RECIPE_FILE=${BASH_SOURCE[1]-}
# Names of the variables the user gave in the environment: smoke_settings must
# not override those. Taken before defaults.sh assigns anything; the recipe's
# own lines, run before this, only assign plain (unexported) shell variables,
# which compgen -e does not list.
NATBIAS_USER_VARS=" $(compgen -e | tr '\n' ' ') "

# Use the repository's virtual environment when fairseq is not on PATH.
if ! command -v fairseq-train >/dev/null && [[ -x $NATBIAS_REPO/.venv/bin/fairseq-train ]]; then
    PATH=$NATBIAS_REPO/.venv/bin:$PATH
fi

# --- messages and markers --------------------------------------------------------

say() { printf '[natbias %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { say "error: $*"; exit 1; }
user_set() { [[ $NATBIAS_USER_VARS == *" $1 "* ]]; }
tools() { python "$NATBIAS_RECIPES/natbias_tools.py" "$@"; }

# A step's directory holds .done with the settings it was made with. A
# different stamp means the settings changed since: stop rather than mix data.
is_done() {
    local dir=$1 stamp=$2
    [[ -f $dir/.done ]] || return 1
    [[ $(<"$dir/.done") == "$stamp" ]] && return 0
    die "$dir was made with other settings ($(<"$dir/.done")); remove it to redo it with: $stamp"
}
mark_done() { printf '%s\n' "$2" >"$1/.done"; }

# Other nodes of a multi-node job wait for node 0's data instead of racing it.
wait_for() {
    say "node $NODE_RANK: waiting for $1"
    until [[ -f $1 ]]; do sleep 10; done
}

download() {
    local url=$1 out=$2
    [[ -s $out && ! -f $out.part ]] && return 0
    say "downloading $url"
    mkdir -p "$(dirname "$out")"
    touch "$out.part"
    if command -v wget >/dev/null; then
        wget -q --tries=3 -c -O "$out" "$url"
    else
        curl -fL --retry 3 -C - -o "$out" "$url"
    fi
    rm -f "$out.part"
}

# --- SMOKE=1: the same steps on CPU, tiny ---------------------------------------

smoke_default() { user_set "$1" || printf -v "$1" '%s' "$2"; }

smoke_settings() {
    [[ ${SMOKE:-0} == 1 ]] || return 0
    say "SMOKE=1: tiny models, few updates, on CPU"
    smoke_default NGPUS 0
    smoke_default SEEDS "1 2"
    smoke_default TRAIN_LINES 3000
    smoke_default EVAL_LINES 50
    smoke_default SPM_VOCAB 1000
    smoke_default SPM_MODEL ""
    smoke_default MODEL_ARGS "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 2 --decoder-attention-heads 2"
    smoke_default MAX_TOKENS 1000
    smoke_default TOKENS_PER_UPDATE 1000
    smoke_default LR 1e-3
    smoke_default WARMUP 10
    smoke_default MAX_UPDATE 30
    smoke_default MAX_EPOCH 0
    smoke_default SAVE_INTERVAL_UPDATES 0
    smoke_default LOG_INTERVAL 5
    # Barely trained models decode up to the length limit: use the tighter
    # one of fairseq's IWSLT example (1.2 x source length + 10).
    smoke_default MAX_LEN_A 1.2
    smoke_default MAX_LEN_B 10
}

# --- hardware: world size, batch, launcher ----------------------------------------

detect_gpus() {
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .
    elif command -v nvidia-smi >/dev/null; then
        nvidia-smi --list-gpus 2>/dev/null | grep -c GPU || true
    else
        echo 0
    fi
}

world_size() { if ((NGPUS > 0)); then echo $((NGPUS * NNODES)); else echo "$CPU_WORKERS"; fi; }

# Keeps tokens per update (MAX_TOKENS x UPDATE_FREQ x world size) at
# TOKENS_PER_UPDATE whatever the hardware, unless UPDATE_FREQ is given.
update_freq() {
    if [[ -n $UPDATE_FREQ ]]; then echo "$UPDATE_FREQ"; return; fi
    local per_step=$((MAX_TOKENS * $(world_size)))
    local freq=$(((TOKENS_PER_UPDATE + per_step - 1) / per_step))
    echo $((freq > 0 ? freq : 1))
}

master_port() {
    if [[ -n $MASTER_PORT ]]; then echo "$MASTER_PORT"
    elif ((NNODES > 1)); then echo 29500   # every node must agree without talking
    else tools free-port; fi
}

# launch LOG ARGS...: fairseq-train ARGS on all ranks; rank 0 (node 0) appends
# to LOG, other CPU ranks / nodes to LOG with .rank<r> / .node<n> inserted.
launch() {
    local log=$1; shift
    if ((NGPUS > 0)); then
        # torchrun starts one process per GPU and sets RANK/WORLD_SIZE, which
        # fairseq reads (its own --distributed-world-size must match them).
        local out=$log
        ((NODE_RANK == 0)) || out=${log%.log}.node$NODE_RANK.log
        torchrun --nproc_per_node "$NGPUS" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
            --master_addr "$MASTER_ADDR" --master_port "$(master_port)" \
            "$(command -v fairseq-train)" "$@" --distributed-world-size "$(world_size)" \
            >>"$out" 2>&1
    elif ((CPU_WORKERS > 1)); then
        launch_cpu_ranks "$log" "$@"
    else
        fairseq-train "$@" --cpu >>"$log" 2>&1
    fi
}

# fairseq has no CPU launcher: torchrun + --cpu trains N independent models,
# and its own spawn needs GPUs. So: one process per rank, joined over gloo.
launch_cpu_ranks() {
    local log=$1; shift
    local port threads r out pids=()
    port=$(master_port)
    threads=$(($(nproc) / CPU_WORKERS)); ((threads > 0)) || threads=1
    for ((r = 0; r < CPU_WORKERS; r++)); do
        out=$log; ((r == 0)) || out=${log%.log}.rank$r.log
        OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} fairseq-train "$@" --cpu \
            --distributed-world-size "$CPU_WORKERS" --distributed-rank "$r" \
            --distributed-init-method "tcp://127.0.0.1:$port" --distributed-no-spawn \
            --distributed-backend gloo --ddp-backend legacy_ddp >>"$out" 2>&1 &
        pids+=($!)
    done
    wait_ranks "${pids[@]}"
}

# A rank that dies leaves the others blocked in a collective: stop them too.
wait_ranks() {
    local pids=("$@") pid left
    while ((${#pids[@]})); do
        left=()
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then left+=("$pid"); continue; fi
            if ! wait "$pid"; then
                for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
                wait 2>/dev/null || true
                return 1
            fi
        done
        pids=(${left[@]+"${left[@]}"})
        ((${#pids[@]} == 0)) || sleep 1
    done
}

# --- data: fetch, stage, SentencePiece, binarise -------------------------------------

corpus_of() { printf '%s\n' "$1" "$2" | sort | paste -sd- -; }

# IWSLT'14 De-En as fairseq's examples/translation/prepare-iwslt14.sh makes it
# (valid: every 23rd training line; test: dev2010, tst2010-2012, TEDx dev2012),
# without its Moses tokenisation and lowercasing: SentencePiece takes raw text
# and sacreBLEU scores detokenised, cased output.
fetch_iwslt14() {
    local dest=$1 orig=$1/orig l set
    is_done "$dest" iwslt14 && return 0
    mkdir -p "$orig"
    download "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz" "$orig/de-en.tgz"
    tar -xzf "$orig/de-en.tgz" -C "$orig"
    for l in de en; do
        grep -v -e '<url>' -e '<talkid>' -e '<keywords>' "$orig/de-en/train.tags.de-en.$l" |
            sed -e 's/<title>//g; s/<\/title>//g; s/<description>//g; s/<\/description>//g' \
                >"$dest/train.tags.$l"
        awk 'NR % 23 == 0' "$dest/train.tags.$l" >"$dest/valid.$l"
        awk 'NR % 23 != 0' "$dest/train.tags.$l" >"$dest/train.$l"
        for set in TED.dev2010 TEDX.dev2012 TED.tst2010 TED.tst2011 TED.tst2012; do
            xml_segments "$orig/de-en/IWSLT14.$set.de-en.$l.xml"
        done >"$dest/test.$l"
    done
    mark_done "$dest" iwslt14
}

xml_segments() {
    grep '<seg id' "$1" | sed -e 's/<seg id="[0-9]*">\s*//g' -e 's/\s*<\/seg>\s*//g' -e "s/\’/\'/g"
}

# WMT'14 En-De as fairseq's prepare-wmt14en2de.sh --icml17 (Europarl v7,
# Common Crawl, News Commentary v9: ~4.5M pairs), newstest2013 for validation,
# newstest2014 (full, 3003 sentences) for test. `fetch_wmt14 DIR test` fetches
# the test set alone (the out-of-domain test of IWSLT models).
fetch_wmt14() {
    local dest=$1 what=${2:-all} orig=$1/orig l side f
    is_done "$dest" "wmt14-$what" && return 0
    mkdir -p "$orig"
    download "https://www.statmt.org/wmt14/test-full.tgz" "$orig/test-full.tgz"
    tar -xzf "$orig/test-full.tgz" -C "$orig"
    for l in de en; do
        side=ref; [[ $l == de ]] && side=src   # the de-en test was translated from German
        xml_segments "$orig/test-full/newstest2014-deen-$side.$l.sgm" >"$dest/test.$l"
    done
    if [[ $what == all ]]; then
        for f in wmt13/training-parallel-europarl-v7 wmt13/training-parallel-commoncrawl \
            wmt14/training-parallel-nc-v9 wmt14/dev; do
            download "https://www.statmt.org/$f.tgz" "$orig/${f#*/}.tgz"
            tar -xzf "$orig/${f#*/}.tgz" -C "$orig"
        done
        for l in de en; do
            cat "$orig/training/europarl-v7.de-en.$l" "$orig/commoncrawl.de-en.$l" \
                "$orig/training/news-commentary-v9.de-en.$l" >"$dest/train.$l"
            cp "$orig/dev/newstest2013.$l" "$dest/valid.$l"
        done
    fi
    mark_done "$dest" "wmt14-$what"
}

# AfroMT (Reid et al., 2021) as its authors ship it: the data archive on Google
# Drive (gdown, as their README says) with en-<xx>/{train,valid,test}.{en,xx},
# and their SentencePiece model from their repository.
AFROMT_DATA_ID=1hEVw9zNELdfImEDEIKW2pXEEUHimwRXZ
AFROMT_REPO_RAW=https://raw.githubusercontent.com/machelreid/afromt/dfd2d32c3ccb2cc4e657fbcbc3f78d67dcd001bd

fetch_afromt() {
    local dest=$1
    is_done "$dest" afromt && return 0
    mkdir -p "$dest"
    if [[ ! -s $dest/afromt.tar.xz ]]; then
        command -v gdown >/dev/null || die "the AfroMT data is on Google Drive: pip install gdown"
        say "downloading AfroMT (Google Drive id $AFROMT_DATA_ID)"
        gdown "https://drive.google.com/uc?id=$AFROMT_DATA_ID" -O "$dest/afromt.tar.xz"
    fi
    tar -xJf "$dest/afromt.tar.xz" -C "$dest"
    # The archive holds afromt/en-<xx>/: make the pair folders visible in dest.
    local pair
    for pair in "$dest"/afromt/en-*; do [[ -d $pair ]] && ln -sfn "$pair" "$dest/"; done
    download "$AFROMT_REPO_RAW/spm_model.model" "$dest/spm_model.model"
    mark_done "$dest" afromt
}

# C4 English (App. A.7's large general-domain corpus): N shards of ~350k
# documents each, one line per paragraph.
fetch_c4() {
    local dest=$1 shards=$2 i name files=()
    is_done "$dest" "c4-$shards" && return 0
    mkdir -p "$dest"
    for ((i = 0; i < shards; i++)); do
        name=$(printf 'c4-train.%05d-of-01024.json.gz' "$i")
        download "https://hf-p-cfw.fyan.top/datasets/allenai/c4/resolve/main/en/$name" "$dest/$name"
        files+=("$dest/$name")
    done
    tools jsonl-text --input "${files[@]}" --output "$dest/c4.en"
    mark_done "$dest" "c4-$shards"
}

# The directory with the corpus's raw text: RAW_DIR, or what DATASET downloads.
raw_source() {
    if [[ -n $RAW_DIR ]]; then echo "$RAW_DIR"; return; fi
    [[ -n $DATASET ]] || die "set RAW_DIR to the directory holding the raw text"
    "fetch_$DATASET" "$WORK_DIR/download/$DATASET" >&2
    echo "$WORK_DIR/download/$DATASET"
}

# Files of one corpus may sit in DIR/<src>-<tgt>/, DIR/<tgt>-<src>/ or DIR/.
find_prefix() {
    local dir=$1 name=$2 l1=$3 l2=$4 sub
    for sub in "$l1-$l2/" "$l2-$l1/" ""; do
        if compgen -G "$dir/$sub$name.$l1*" >/dev/null; then echo "$dir/$sub$name"; return; fi
    done
    die "no $name.$l1 (or .gz) in $dir, $dir/$l1-$l2 or $dir/$l2-$l1"
}

# OOD_TEST names the out-of-domain test set (App. A.5): a dataset whose test
# set is fetched (wmt14, iwslt14) or a text prefix PREFIX.<lang>[.gz].
ood_prefix() {
    case $OOD_TEST in
        wmt14) fetch_wmt14 "$WORK_DIR/download/wmt14-test" test >&2
            echo "$WORK_DIR/download/wmt14-test/test" ;;
        iwslt14) fetch_iwslt14 "$WORK_DIR/download/iwslt14" >&2
            echo "$WORK_DIR/download/iwslt14/test" ;;
        *) echo "$OOD_TEST" ;;
    esac
}

stage_raw() {
    local raw=$1 l1=$2 l2=$3 from stamp train valid test ood=""
    stamp="raw=${RAW_DIR:-$DATASET} $RAW_TRAIN/$RAW_VALID/$RAW_TEST ood=$OOD_TEST lines=$TRAIN_LINES/$EVAL_LINES clean=$CLEAN_MAX_WORDS/$CLEAN_RATIO"
    is_done "$raw" "$stamp" && { say "skip: $raw (done)"; return 0; }
    from=$(raw_source)
    train=$(find_prefix "$from" "$RAW_TRAIN" "$l1" "$l2")
    valid=$(find_prefix "$from" "$RAW_VALID" "$l1" "$l2")
    test=$(find_prefix "$from" "$RAW_TEST" "$l1" "$l2")
    [[ -z $OOD_TEST ]] || ood=$(ood_prefix)
    say "staging $l1-$l2 text from $from into $raw"
    mkdir -p "$raw"
    local clean=(--clean --max-words "$CLEAN_MAX_WORDS" --ratio "$CLEAN_RATIO")
    tools stage --langs "$l1" "$l2" --input "$train" --output "$raw/train" \
        --max-lines "$TRAIN_LINES" "${clean[@]}"
    tools stage --langs "$l1" "$l2" --input "$valid" --output "$raw/valid" \
        --max-lines "$EVAL_LINES" "${clean[@]}"
    # Test sets are not cleaned: every line is scored.
    tools stage --langs "$l1" "$l2" --input "$test" --output "$raw/test" --max-lines "$EVAL_LINES"
    if [[ -n $ood ]]; then
        tools stage --langs "$l1" "$l2" --input "$ood" --output "$raw/ood" --max-lines "$EVAL_LINES"
    fi
    mark_done "$raw" "$stamp"
}

# One joint model for both languages (sec. 4.1, footnote 8), or SPM_MODEL.
make_spm() {
    local raw=$1 spm=$2 l1=$3 l2=$4 stamp
    stamp="spm=${SPM_MODEL:-joint-$SPM_VOCAB}"
    is_done "$spm" "$stamp" && { say "skip: $spm (done)"; return 0; }
    spm_model "$spm" "$raw/train.$l1" "$raw/train.$l2"
    tools spm-encode --model "$spm/spm.model" --input "$raw"/*."$l1" "$raw"/*."$l2" --output-dir "$spm"
    mark_done "$spm" "$stamp"
}

# spm_model DIR TEXT...: DIR/spm.model, trained on TEXT (SPM_MODEL empty) or SPM_MODEL's.
spm_model() {
    local spm=$1; shift
    mkdir -p "$spm"
    case $SPM_MODEL in
        "") say "training a joint SentencePiece model ($SPM_VOCAB pieces) on $*"
            tools spm-train --input "$@" --prefix "$spm/spm" \
                --vocab-size "$SPM_VOCAB" --max-sentences "$SPM_SENTENCES" --threads "$(nproc)" ;;
        afromt) fetch_afromt "$WORK_DIR/download/afromt"
            cp "$WORK_DIR/download/afromt/spm_model.model" "$spm/spm.model" ;;
        *) cp "$SPM_MODEL" "$spm/spm.model" ;;
    esac
}

# The out-of-domain test, when there is one, becomes the split test1.
binarize() {
    local spm=$1 dest=$2 tests=$1/test
    is_done "$dest" "$spm" && { say "skip: $dest (done)"; return 0; }
    say "binarising $SRC-$TGT into $dest"
    rm -rf "$dest"
    [[ -f $spm/ood.$SRC ]] && tests+=",$spm/ood"
    # One dictionary for both sides: the SentencePiece model is joint, and the
    # embeddings are shared (--share-all-embeddings).
    fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --joined-dictionary \
        --trainpref "$spm/train" --validpref "$spm/valid" --testpref "$tests" \
        --destdir "$dest" --workers "$(nproc)" >"$DIR/preprocess.log" 2>&1 ||
        { tail "$DIR/preprocess.log" >&2; die "fairseq-preprocess failed: $DIR/preprocess.log"; }
    mark_done "$dest" "$spm"
}

# App. A.7: target-side counts from EXTERNAL_TEXT for --natbias-init file.
external_counts() {
    local spm=$1 out=$DIR/external.counts text tok=$DIR/external
    [[ -n $EXTERNAL_TEXT ]] || return 0
    [[ -s $out ]] && { say "skip: $out (done)"; return 0; }
    case $EXTERNAL_TEXT in
        c4 | c4:*)
            [[ $TGT == en ]] || { say "EXTERNAL_TEXT=c4 is English; no file init for $SRC-$TGT"; return 0; }
            local shards=${EXTERNAL_TEXT#c4}; shards=${shards#:}
            fetch_c4 "$WORK_DIR/download/c4" "${shards:-1}"
            text=$WORK_DIR/download/c4/c4.en ;;
        *) text=${EXTERNAL_TEXT//\{lang\}/$TGT} ;;
    esac
    [[ -f $text ]] || { say "no external text $text; no file init for $SRC-$TGT"; return 0; }
    say "counting $TGT pieces of $text (App. A.7)"
    mkdir -p "$tok"
    tools spm-encode --model "$spm/spm.model" --input "$text" --output-dir "$tok"
    PYTHONPATH=$NATBIAS_REPO${PYTHONPATH:+:$PYTHONPATH} python -m fairseq_natbias.cli.count \
        --dict "$DIR/data-bin/dict.$TGT.txt" --text "$tok/$(basename "${text%.gz}")" --output "$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$tok"
}

prepare_direction() {
    local corpus raw spm
    corpus=$WORK_DIR/corpus/$(corpus_of "$SRC" "$TGT")
    raw=$corpus/raw spm=$corpus/spm
    if ((NODE_RANK > 0)); then wait_for "$DIR/.prepared"; return; fi
    # Tasks of a job array may start together: one prepares, the others wait
    # for it and then find everything done.
    local lock
    exec {lock}>"$WORK_DIR/.prepare.lock"
    if command -v flock >/dev/null; then flock "$lock"; fi
    stage_raw "$raw" "$SRC" "$TGT"
    make_spm "$raw" "$spm" "$SRC" "$TGT"
    binarize "$spm" "$DIR/data-bin"
    external_counts "$spm"
    touch "$DIR/.prepared"
    exec {lock}>&-
}

corpora() { for pair in $PAIRS; do corpus_of "${pair%-*}" "${pair#*-}"; done | sort -u; }
lang_pairs() { echo $PAIRS | tr ' ' ,; }

# MULTILINGUAL=1: every corpus staged as for one pair, one SentencePiece model
# over all their training text, one dictionary, every pair binarised into
# one data-bin (examples/multilingual/prepare.py's binarise).
prepare_multilingual() {
    local corpus raw spm=$DIR/spm stamp="spm=${SPM_MODEL:-joint-$SPM_VOCAB} pairs=$PAIRS" tests=(test)
    if ((NODE_RANK > 0)); then wait_for "$DIR/.prepared"; return; fi
    local lock
    exec {lock}>"$WORK_DIR/.prepare.lock"
    if command -v flock >/dev/null; then flock "$lock"; fi
    for corpus in $(corpora); do stage_raw "$WORK_DIR/corpus/$corpus/raw" ${corpus/-/ }; done
    if ! is_done "$spm" "$stamp"; then
        local texts=()
        for corpus in $(corpora); do texts+=("$WORK_DIR/corpus/$corpus/raw"/train.*); done
        spm_model "$spm" "${texts[@]}"
        for corpus in $(corpora); do
            raw=$WORK_DIR/corpus/$corpus/raw
            tools spm-encode --model "$spm/spm.model" --input "$raw"/* --output-dir "$spm/$corpus"
        done
        mark_done "$spm" "$stamp"
    else say "skip: $spm (done)"; fi
    if ! is_done "$DIR/data-bin" "$stamp"; then
        say "binarising $PAIRS into $DIR/data-bin"
        rm -rf "$DIR/data-bin"
        [[ -z $OOD_TEST ]] || tests+=(ood)
        tools multilingual-bin --pairs $PAIRS --pieces "$spm" --tests "${tests[@]}" \
            --out "$DIR/data-bin" --workers "$(nproc)" >"$DIR/preprocess.log" 2>&1 ||
            { tail "$DIR/preprocess.log" >&2; die "binarising failed: $DIR/preprocess.log"; }
        mark_done "$DIR/data-bin" "$stamp"
    else say "skip: $DIR/data-bin (done)"; fi
    touch "$DIR/.prepared"
    exec {lock}>&-
}

# --- the grid ----------------------------------------------------------------------------

# Runs, in order: INITS, then `file` (App. A.7) when there are external counts,
# then <init>-unireg (App. A.4) when UNIGRAM_REG_WEIGHT is set, then
# <init>-unigram-ls for UNIGRAM_LS_INITS (their own names, so that they never
# resume, or get skipped as, a run of the paper's criterion).
grid_names() {
    local init
    echo $INITS
    [[ -s $DIR/external.counts ]] && echo file
    if [[ -n $UNIGRAM_REG_WEIGHT ]]; then
        for init in $UNIGRAM_REG_INITS; do echo "$init-unireg"; done
    fi
    for init in $UNIGRAM_LS_INITS; do echo "$init-unigram-ls"; done
}

# "<name> <seed>" per run; GRID_TASK=k keeps only the k-th (0-based; for job arrays).
grid_runs() {
    local name seed k=0
    for name in $(grid_names); do
        for seed in $SEEDS; do
            [[ -z $GRID_TASK || $GRID_TASK == "$k" ]] && echo "$name $seed"
            k=$((k + 1))
        done
    done
}

# The task's options: one pair (translation), or with MULTILINGUAL=1 every
# pair of PAIRS in one model, each sentence's languages given as a token to
# the encoder and the decoder; `task_args generate` adds the direction decoded.
task_args() {
    if [[ $MULTILINGUAL == 1 ]]; then
        TASK=(--task translation_multi_simple_epoch --lang-pairs "$(lang_pairs)"
            --lang-dict "$DIR/data-bin/langs.txt" --encoder-langtok src --decoder-langtok)
        [[ ${1-} == generate ]] || return 0
    else
        TASK=(--task translation)
    fi
    TASK+=(--source-lang "$SRC" --target-lang "$TGT")
}

# The model's options: the natural bias with init INIT, or fairseq's own
# transformer (stock) with the same sizes, which ARCH's presets do not spell out.
model_args() {
    local init=$1
    if [[ $init == stock ]]; then
        [[ $ARCH == transformer_natbias ]] ||
            die "INITS=stock is fairseq's transformer at MODEL_ARGS's sizes: set ARCH=transformer_natbias (not the preset $ARCH) and the sizes in MODEL_ARGS"
        MODEL=(--arch transformer)
    else
        MODEL=(--arch "$ARCH" --natbias-init "$init")
        [[ $MULTILINGUAL != 1 || $init == none ]] || MODEL+=(--natbias-prior "$NATBIAS_PRIOR")
    fi
}

# Fills the array ARGS with fairseq-train's arguments for one run.
train_args() {
    local name=$1 seed=$2 run=$3 init=${1%-unireg} model=() extra=()
    init=${init%-unigram-ls}
    read -ra model <<<"$(recipe_model_args) $MODEL_ARGS"
    read -ra extra <<<"$TRAIN_ARGS"
    task_args
    model_args "$init"
    ARGS=("$DIR/data-bin" --user-dir "$NATBIAS_REPO/fairseq_natbias" "${TASK[@]}"
        "${MODEL[@]}" --share-all-embeddings ${model[@]+"${model[@]}"}
        --seed "$seed" --save-dir "$run"
        # sec. 4.1
        --dropout 0.1 --optimizer adam --adam-betas "(0.9, 0.997)"
        --label-smoothing 0.1
        # fairseq's usual schedule (the paper does not give one)
        --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP"
        --warmup-init-lr 1e-07 --weight-decay "$WEIGHT_DECAY" --clip-norm 0.0
        --max-tokens "$MAX_TOKENS" --update-freq "$(update_freq)"
        --max-epoch "$MAX_EPOCH" --max-update "$MAX_UPDATE" --patience "$PATIENCE"
        --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates 1
        --no-epoch-checkpoints --skip-invalid-size-inputs-valid-test
        # fairseq drops a last batch not a multiple of 8 (issue #5036): keep
        # every validation sentence.
        --required-batch-size-multiple 1
        --log-format simple --log-interval "$LOG_INTERVAL")
    # Early stopping on validation BLEU (sec. 4.1); fairseq's multilingual
    # task computes no BLEU while training: on validation loss there.
    [[ $MULTILINGUAL == 1 ]] || ARGS+=(--eval-bleu --eval-bleu-args "$(valid_generation)"
        --eval-bleu-detok space --eval-bleu-remove-bpe sentencepiece
        --best-checkpoint-metric bleu --maximize-best-checkpoint-metric)
    if [[ $name == *-unireg ]]; then
        ARGS+=(--criterion unigram_regularized_cross_entropy
            --unigram-reg-weight "$UNIGRAM_REG_WEIGHT" --unigram-reg-updates "$UNIGRAM_REG_UPDATES")
    elif [[ $name == *-unigram-ls ]]; then
        ARGS+=(--criterion unigram_label_smoothed_cross_entropy)
    else
        ARGS+=(--criterion label_smoothed_cross_entropy)
    fi
    [[ $init == file ]] && ARGS+=(--natbias-counts "$DIR/external.counts")
    ((NGPUS > 0)) && [[ $FP16 == 1 ]] && ARGS+=(--fp16)
    ARGS+=(${extra[@]+"${extra[@]}"})
}

# Validation BLEU decodes as the test does (fairseq's max_len defaults: 0, 200).
valid_generation() {
    if [[ $MAX_LEN_A == 0 && $MAX_LEN_B == 200 ]]; then
        echo "{\"beam\": $BEAM}"
    else
        echo "{\"beam\": $BEAM, \"max_len_a\": $MAX_LEN_A, \"max_len_b\": $MAX_LEN_B}"
    fi
}

# A stopped run resumes: fairseq restores <run>/checkpoint_last.pt by itself.
train_run() {
    local name=$1 seed=$2 run=$MODELS/$1/seed$2
    if [[ -f $run/.done ]]; then say "skip: $run (trained)"; return 0; fi
    mkdir -p "$run"
    train_args "$name" "$seed" "$run"
    printf '%q ' fairseq-train "${ARGS[@]}" >"$run/train.args"
    local how="resuming" ; [[ -f $run/checkpoint_last.pt ]] || how="training"
    local what="$SRC-$TGT"; [[ $MULTILINGUAL != 1 ]] || what=$(lang_pairs)
    say "$how $what $name seed $seed on $(world_size) $( ((NGPUS > 0)) && echo GPU || echo CPU) worker(s), update-freq $(update_freq): $run/train.log"
    if ! launch "$run/train.log" "${ARGS[@]}" </dev/null; then
        tail -n 25 "$run/train.log" >&2
        die "training failed: $run/train.log"
    fi
    ((NODE_RANK == 0)) && date >"$run/.done"
    return 0
}

# --- evaluation and report -----------------------------------------------------------------

# Beam search with length normalisation (fairseq's --lenpen 1 divides by
# length), detokenised by SentencePiece, scored by sacreBLEU against raw text.
# evaluate_set RUN SET SUBSET REFERENCE MODEL: RUN/SET.* from MODEL/checkpoint_best.pt.
evaluate_set() {
    local run=$1 set=$2 subset=$3 ref=$4 model=$5
    [[ -f $run/$set.chrf.json ]] && { say "skip: $run/$set (scored)"; return 0; }
    local device=(); ((NGPUS > 0)) || device=(--cpu)
    mkdir -p "$run"
    task_args generate
    fairseq-generate "$DIR/data-bin" --user-dir "$NATBIAS_REPO/fairseq_natbias" \
        "${TASK[@]}" --gen-subset "$subset" \
        --path "$model/checkpoint_best.pt" --beam "$BEAM" --lenpen "$LENPEN" \
        --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" --required-batch-size-multiple 1 \
        --remove-bpe sentencepiece --max-tokens "$MAX_TOKENS" ${device[@]+"${device[@]}"} \
        >"$run/$set.gen" 2>"$run/$set.gen.log" || { tail "$run/$set.gen.log" >&2; die "generation failed: $run"; }
    # Writes $set.hyp, $set.bleu.json and, last, $set.chrf.json (the marker).
    local scores
    scores=$(tools score --generate-output "$run/$set.gen" --reference "$ref" --prefix "$run/$set")
    say "$run/$set: $scores"
}

# The scores of a run go next to its model; with MULTILINGUAL=1 to each direction's folder.
evaluate_run() {
    local run=$RUNS/$1/seed$2 model=$MODELS/$1/seed$2 raw
    [[ -f $model/.done ]] || { say "not trained yet: $model"; return 0; }
    raw=$WORK_DIR/corpus/$(corpus_of "$SRC" "$TGT")/raw
    evaluate_set "$run" test test "$raw/test.$TGT" "$model"
    if [[ -f $DIR/data-bin/test1.$SRC-$TGT.$SRC.bin ]]; then
        evaluate_set "$run" ood test1 "$raw/ood.$TGT" "$model"
    fi
}

report() {
    [[ -d $RUNS ]] || return 0
    local out=$DIR/results.md title="$RECIPE_NAME $SRC→$TGT"
    if [[ $MULTILINGUAL == 1 ]]; then out=$DIR/$SRC-$TGT/results.md title+=" (one model: $PAIRS)"; fi
    say "results: $out"
    tools table --runs "$RUNS" --output "$out" --title "$title" \
        --beam "$BEAM" --lenpen "$LENPEN" --order $INITS file
}

# --- main -----------------------------------------------------------------------------------

# Recipes may define recipe_model_args (e.g. AfroMT's 4 heads for Rundi).
declare -F recipe_model_args >/dev/null || recipe_model_args() { :; }

has_step() { [[ " $STEPS " == *" $1 "* ]]; }

run_recipe() {
    smoke_settings
    [[ -n $NGPUS ]] || NGPUS=$(detect_gpus)
    ((NGPUS > 0 || NNODES == 1)) || die "multi-node training needs GPUs (NGPUS > 0)"
    [[ $MULTILINGUAL != 1 || -z $EXTERNAL_TEXT ]] ||
        die "EXTERNAL_TEXT is counted for one target language, a MULTILINGUAL=1 model has several: unset EXTERNAL_TEXT"
    export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
    mkdir -p "$WORK_DIR"
    WORK_DIR=$(cd "$WORK_DIR" && pwd)
    say "$RECIPE_NAME: pairs '$PAIRS', steps '$STEPS', work dir $WORK_DIR"
    if [[ $MULTILINGUAL == 1 ]]; then run_one_model; else run_each_pair; fi
    say "$RECIPE_NAME: done"
}

run_each_pair() {
    local pair
    for pair in $PAIRS; do
        SRC=${pair%-*} TGT=${pair#*-}
        DIR=$WORK_DIR/$SRC-$TGT RUNS=$WORK_DIR/$SRC-$TGT/$RUNS_NAME MODELS=$RUNS
        mkdir -p "$DIR"
        if has_step prepare; then prepare_direction; fi
        train_grid "$SRC-$TGT"
        ((NODE_RANK == 0)) || continue
        evaluate_direction
    done
}

# MULTILINGUAL=1: one model over PAIRS, scored and reported per direction.
run_one_model() {
    local pair
    SRC="" TGT="" DIR=$WORK_DIR/multilingual MODELS=$WORK_DIR/multilingual/$RUNS_NAME
    mkdir -p "$DIR"
    if has_step prepare; then prepare_multilingual; fi
    train_grid "$PAIRS"
    ((NODE_RANK == 0)) || return 0
    for pair in $PAIRS; do
        SRC=${pair%-*} TGT=${pair#*-} RUNS=$DIR/$pair/$RUNS_NAME
        evaluate_direction
    done
}

train_grid() {
    local name seed
    has_step train || return 0
    [[ -f $DIR/.prepared ]] || die "no data for $1 yet: run STEPS=prepare first"
    while read -r name seed; do train_run "$name" "$seed"; done < <(grid_runs)
}

evaluate_direction() {
    local name seed
    if has_step evaluate; then
        while read -r name seed; do evaluate_run "$name" "$seed"; done < <(grid_runs)
    fi
    if has_step report; then report; fi
}

# --- settings: defaults.sh and run.sh --help -------------------------------------------

# The comment ("# ...") of the line of FILE that sets NAME; fails when FILE
# has no such line.
setting_comment() {
    local file=$1 name=$2 line
    while IFS= read -r line; do
        [[ $line == "$name=\${$name-"* ]] || continue
        # The comment starts at the first " #": values hold no " #", comments may hold "}".
        [[ $line =~ [[:space:]](#.*)$ ]] && echo "${BASH_REMATCH[1]}"
        return 0
    done <"$file"
    return 1
}

# Every setting in defaults.sh's order and sections, as NAME=value (quoted when
# it holds spaces, as in the files) and the comment of the line that set it:
# the recipe's line when it has one, else defaults.sh's.
print_settings() {
    local defaults=$NATBIAS_RECIPES/defaults.sh setting='^([A-Z][A-Z0-9_]*)=\$\{' line name value comment
    echo "# $NATBIAS_RECIPE_FILE: the environment's value, else the recipe's, else defaults.sh's"
    if [[ ${SMOKE:-0} == 1 ]]; then echo "# SMOKE=1: [smoke: x] values unless given in the environment"; fi
    while IFS= read -r line; do
        if [[ $line == "# ---"* ]]; then printf '\n%s\n' "$line"; continue; fi
        [[ $line =~ $setting ]] || continue
        name=${BASH_REMATCH[1]}
        value=${!name}
        if [[ $value == *[[:space:]]* ]]; then value="\"$value\""; fi
        comment=$(setting_comment "$NATBIAS_RECIPE_FILE" "$name") ||
            comment=$(setting_comment "$defaults" "$name")
        printf '%-39s %s\n' "$name=$value" "$comment"
    done <"$defaults"
}

# Sourced after the recipe's lines: the environment, then the recipe, then these.
source "$NATBIAS_RECIPES/defaults.sh"

# Settings come from the environment; the only argument is --help (-h).
case "${1-}" in
    -h | --help) smoke_settings; print_settings; exit 0 ;;
    "") ;;
    *) die "usage: $0 [--help]; settings are given in the environment (see --help)" ;;
esac
