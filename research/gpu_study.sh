#!/bin/bash
# The learning-efficiency study on a lent GPU machine
# (research/studies/gpu_check.md, "The study on a GPU"): Multi30k De->En and
# Fr->En side by side, each
# `study_learning_efficiency.py --pair P --device cuda --workdir WORKDIR
# --results WORKDIR/results ARGS...`, for at most SECONDS; then every run's
# log, update-0 record, scores and the finished runs' records (no checkpoint)
# go to OUT/study_runs.tgz, with each study's own log beside it.
# Runs still training at the deadline are stopped; the study resumes them from
# their last checkpoint when this is called again on the same (warm) machine.
#
#   bash research/gpu_study.sh SECONDS OUT WORKDIR ARGS...
#
# PY (default python3) is the Python with fairseq importable.
set -u
deadline=$1 out=$2 workdir=$3
shift 3
py=${PY:-python3}
mkdir -p "$out"
started=$SECONDS
studies=()
for pair in de-en fr-en; do
    # Each study in a session of its own: at the deadline its whole process
    # group (the study and the fairseq processes it started) is stopped.
    setsid "$py" research/study_learning_efficiency.py --pair "$pair" --device cuda \
        --workdir "$workdir" --results "$workdir/results" "$@" \
        >> "$out/study_$pair.log" 2>&1 &
    studies+=($!)
done
while [ $((SECONDS - started)) -lt "$deadline" ] && [ -n "$(jobs -rp)" ]; do
    sleep 5
done
if [ -n "$(jobs -rp)" ]; then
    echo "gpu_study: deadline of $deadline s reached: stopping the runs still training"
    for pid in "${studies[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
fi
wait
# Everything a summary needs, a few MB: no checkpoints.
find "$workdir" -name train.log -o -name step0.json -o -name '*scores.json' -o -name done \
    -o -name '*.hyp' -o -path '*/runs/*.json' | tar czf "$out/study_runs.tgz" -T -
tail -n 3 "$out"/study_*.log
echo "gpu_study: $((SECONDS - started)) s"
