#!/usr/bin/env bash
# What a development session with the lent GPU (an H100 or H200, through the `device` tool) runs, phase by phase.
# Each device phase fits one `run` call (10 minutes at most; 30 minutes of device time per session); a machine stays
# warm only ~30 s after a call, so issue the next call right away to keep its files (data cache, runs/, /tmp).
#
#   here, once (no GPU needed):  bash scripts/gpu_session.sh stage
#       copies ../shared/data/cifar10/train.tar.gz (16 MB; ../shared does not travel) into
#       data/shared/cifar10/, which git ignores, a plotly wheel into data/shared/wheels and Ray's wheels into
#       data/ray-a and data/ray-b; the lease's calls below say which each carries
#   on the device, one call: `default` trains the app's default alone (bench/results/h100-2026-11-26b/README.md):
#       run(command="bash scripts/gpu_session.sh default", carry=["data/shared/cifar10"], timeout_s=600)
#   then `record`: Lee et al.'s recipe (100 epochs x 3 passes, bench/train_gpu_default.py's LEE_RECIPE) alone, then
#       the same with the project's regularisation (lee-ours), one after the other, never side by side; each has
#       its own DEADLINE (570 s: a ~540-s budget), so on the device each is one call:
#       run(command="bash scripts/gpu_session.sh record lee", carry=["data/shared/cifar10"], timeout_s=600)
#       run(command="bash scripts/gpu_session.sh record lee-ours", carry=["data/shared/cifar10"], timeout_s=600)
#   `default` and `record` read DATA (an image folder; default: the carried archive, unpacked), DEVICE (cuda),
#   WORK (the run folders) and EXTRA (more vit.train arguments): tests/test_gpu_session.py runs both on the CPU.
#   or the older lease's three calls `start`, `watch`, `finish` (below), or one of these alone:
#       tests   unpack, build the uint8 cache, pytest -m cuda, then the engine's suite (~6 min)
#       bench   bench/bench_gpu.py eager, --compile, --compile reduce-overhead (~6 min)
#   Every phase writes its log and results under $OUT (they come back); nothing here is a
#   measurement until a device session has run it.
#
# The device's own python3 (torch 2.11, torchvision 0.26, timm, transformers, tqdm, safetensors)
# runs the code; it has no streamlit or plotly, so the app and browser tests are left out there.
# The recipes the lease trains, and what the leases so far measured, are in scripts/gpu_sweep.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

stage() {
    local src=${1:-../shared/data/cifar10/train.tar.gz}
    [ -f "$src" ] || src=/work/shared/data/cifar10/train.tar.gz
    mkdir -p data/shared/cifar10
    cp "$src" data/shared/cifar10/train.tar.gz
    # plotly (pure Python), which the device lacks and vit.analyze's report needs (bench_gpu_maps' analyze row).
    local plotly
    plotly=$(.venv/bin/python -c "import plotly; print(plotly.__version__)" 2>/dev/null || echo 6.5.0)
    python3 -m pip download -q --no-deps --only-binary=:all: -d data/shared/wheels "plotly==$plotly" \
        || echo "no plotly wheel: the maps bench's vit.analyze row will say it was skipped"
    # Ray and what ray[default] needs beyond the device's own packages (../.library/device/KINDS.md): the wheel (79 MB) and the data
    # are over one call's 64 MiB, so it travels in two halves, data/ray-a with `start` and data/ray-b with `watch`.
    local ray
    ray=$(.venv/bin/python -c "import ray; print(ray.__version__)" 2>/dev/null || echo 2.60.0)
    rm -rf data/ray-a data/ray-b /tmp/ray-wheels && mkdir -p data/ray-a data/ray-b
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d /tmp/ray-wheels "ray==$ray" aiohttp-cors \
        colorful google-api-core google-auth googleapis-common-protos jsonschema jsonschema-specifications opencensus \
        opencensus-context opentelemetry-api opentelemetry-exporter-prometheus opentelemetry-proto opentelemetry-sdk \
        opentelemetry-semantic-conventions proto-plus pyasn1 pyasn1-modules pydantic pydantic-core annotated-types \
        typing-inspection referencing rpds-py smart-open platformdirs cryptography cffi pycparser tensorboardx
    local whl; whl=$(basename /tmp/ray-wheels/ray-*.whl)
    head -c 42000000 "/tmp/ray-wheels/$whl" > "data/ray-a/$whl.part-a"
    tail -c +42000001 "/tmp/ray-wheels/$whl" > "data/ray-b/$whl.part-b"
    find /tmp/ray-wheels -name '*.whl' ! -name 'ray-*' -exec cp {} data/ray-b/ \;
    echo "staged $(du -sh data/shared | cut -f1) in data/shared, Ray in data/ray-a and data/ray-b"
}

setup() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    fi
    $PY -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)" \
        | tee -a "$OUT/gpu.txt"
    if [ ! -d data/cifar10/train ]; then
        mkdir -p data/cifar10
        tar -xzf data/shared/cifar10/train.tar.gz -C data/cifar10
    fi
    # Decode the 50,000 JPEGs once into data/cache (uint8 tensors); later runs and tests reuse it.
    $PY -c "from vit.training.data import load_dataset; d = load_dataset('folder:data/cifar10/train', 32, 3); \
print('cifar10 cache:', len(d.train), 'train,', len(d.val), 'val,', 'from cache' if d.from_cache else 'built')"
}

tests() {
    setup
    set +e
    $PY -m pytest tests/test_cuda.py -m cuda -v -p no:cacheprovider 2>&1 | tee "$OUT/tests-cuda.log"
    # The rest of the engine's suite on the device's torch (its CPU tests, CUDA where it picks a GPU),
    # bounded so that the call returns with its logs; the slowest files last.
    timeout -s INT 330 $PY -m pytest -q -p no:cacheprovider tests/test_data.py tests/test_images.py \
        tests/test_model.py tests/test_attention.py tests/test_checkpoint.py tests/test_inference.py \
        tests/test_trainer_speed.py tests/test_train.py tests/test_distributed.py tests/test_runs.py 2>&1 \
        | tee "$OUT/tests-suite.log"
    set -e
}

bench() {
    setup
    $PY bench/bench_gpu.py --device cuda --measure-peak --cifar data/cifar10/train 2>&1 | tee "$OUT/bench-eager.txt"
    $PY bench/bench_gpu.py --device cuda --compile --cifar data/cifar10/train --skip-augmentation 2>&1 \
        | tee "$OUT/bench-compile.txt"
    $PY bench/bench_gpu.py --device cuda --compile --compile-mode reduce-overhead --cifar data/cifar10/train \
        --skip-augmentation 2>&1 | tee "$OUT/bench-reduce-overhead.txt"
}

# --- One lease in three calls: start, watch, finish (issue 44). --------------------------------------
# The calls, each right after the last (30 minutes of device time in all, ~1.5 of them the machine's start):
#   run(command="bash scripts/gpu_session.sh start", carry=["data/shared/cifar10", "data/ray-a"], timeout_s=600)
#   run(command="bash scripts/gpu_session.sh watch", carry=["data/shared/wheels", "data/ray-b"], timeout_s=600)
#   run(command="DEADLINE=300 bash scripts/gpu_session.sh finish", timeout_s=330)
# The first lease (bench/results/h100-2026-11-24) trained one recipe, planned from throughput, and it ended at
# 78.3 %: its heavy regularisation (mixup and cutmix on every batch) over only 131 epochs of 88 steps. The second
# (bench/results/h100-2026-11-24b) trained four side by side, still with a graph break at every block: best 84.0 %
# (4-px patches, 162 epochs); compiled training has run ~2.9x faster since. Four recipes train side by side
# (scripts/gpu_sweep.py: a small ViT uses a few per cent of the GPU), each in its own process session so that it
# outlives the call that started it while the machine is warm: issue `watch` and `finish` within ~30 s of the
# previous call's return. `watch` re-plans each run's epochs on its measured pace
# so that all end at one deadline (TRAIN_SECONDS after their launch). Each phase returns by its DEADLINE
# (seconds from its own start, default 570), with its logs under $OUT (8 files at most come back).
DEADLINE=${DEADLINE:-570}
TRAIN_SECONDS=${TRAIN_SECONDS:-1140}
SWEEP=(scripts/gpu_sweep.py)

sweep_until() {  # the runs' progress every 30 s until $1 seconds since the phase began ($T0)
    local now
    while [ $((SECONDS - T0)) -lt "$1" ]; do
        now=$($PY "${SWEEP[@]}" status 2>&1 || true)
        printf '[%s s]\n%s\n' "$((SECONDS - T0))" "$now"
        grep -q running <<< "$now" || return 0
        sleep 30
    done
}

ray_wheel() {  # Ray's wheel is over what one call carries: its halves travel in two calls and meet in /tmp
    mkdir -p /tmp/ray-parts && cp data/ray-a/* data/ray-b/* /tmp/ray-parts/ 2>/dev/null || true
    if ls /tmp/ray-parts/ray-*.part-b >/dev/null 2>&1 && ls /tmp/ray-parts/ray-*.part-a >/dev/null 2>&1; then
        local whl; whl=$(basename /tmp/ray-parts/ray-*.part-a .part-a)
        cat "/tmp/ray-parts/$whl.part-a" "/tmp/ray-parts/$whl.part-b" > "/tmp/ray-parts/$whl"
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/ray-parts/*.whl \
            && echo "ray installed in /tmp/site"
    fi
}

start() {
    T0=$SECONDS
    setup
    ray_wheel
    # On a quiet GPU first: the compiled CIFAR rows, which plan the runs' epochs (ViT-B/16's compiled MFU, 32.1 %,
    # and the measured matmul peak are the second lease's; `finish` adds CUDA graphs).
    timeout 200 $PY bench/bench_gpu.py --device cuda --compile --models cifar-m,cifar-m:p2 \
        --cifar data/cifar10/train --skip-augmentation --json "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench-compile.txt" || true
    touch "$OUT/bench.jsonl"
    $PY "${SWEEP[@]}" launch "$OUT/bench.jsonl" "$TRAIN_SECONDS" 2>&1 | tee "$OUT/plan.txt"
    # Correctness on CUDA while they train (other processes on the same GPU: timings here are not figures).
    set +e
    timeout $((DEADLINE - 60 - (SECONDS - T0))) $PY -m pytest tests/test_cuda.py -m cuda -v \
        -p no:cacheprovider 2>&1 | tee "$OUT/tests-cuda.log" runs/tests-cuda.log
    set -e
    sweep_until "$DEADLINE"
}

watch() {
    T0=$SECONDS
    $PY "${SWEEP[@]}" replan 2>&1 | tee "$OUT/replan.txt"
    set +e
    ray_wheel
    if ls data/shared/wheels/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site data/shared/wheels/*.whl
    fi
    export PYTHONPATH=/tmp/site
    grep -qE "[0-9]+ (passed|failed)" runs/tests-cuda.log 2>/dev/null || \
        timeout 240 $PY -m pytest tests/test_cuda.py -m cuda -v -p no:cacheprovider > "$OUT/tests-cuda-2.log" 2>&1
    # The other GPU paths (the runs share the GPU: times here are upper bounds).
    ( set -x
      mkdir -p /tmp/sae-data && cp -r data/cifar10/train/airplane /tmp/sae-data/  # a link is not followed
      for dev in cuda cpu; do
          rm -rf /tmp/sae-$dev
          /usr/bin/time -f "sae $dev: %e s wall" timeout 150 $PY -m vit.sae train checkpoints/cifar10-cifar-s.pt \
              --data /tmp/sae-data --layer 3 --images 2000 --holdout 200 --epochs 2 --device $dev --out /tmp/sae-$dev
          cat /tmp/sae-$dev/metrics.json
      done
      if $PY -c "import ray" 2>/dev/null; then timeout 240 bash scripts/gpu_session.sh ray; fi
    ) > "$OUT/gpu-paths.log" 2>&1
    CUDA_VISIBLE_DEVICES= timeout $((DEADLINE - 60 - (SECONDS - T0))) $PY -m pytest -q -p no:cacheprovider \
        --timeout 300 tests/test_data.py tests/test_model.py tests/test_attention.py tests/test_checkpoint.py \
        tests/test_inference.py tests/test_trainer_speed.py tests/test_train.py tests/test_runs.py \
        > "$OUT/tests-suite.log" 2>&1
    set -e
    sweep_until "$DEADLINE"
}

ray() {  # a one-node Ray cluster on the device: vit.train --ray on the GPU to completion, then a resume
    local gpus=${RAY_GPUS:-1} bin
    bin=$(cd "$(dirname "$(command -v "$PY")")" && pwd)
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$bin:$PATH
    local c files
    for c in airplane automobile; do  # no `ls | head` here: under pipefail its SIGPIPE ended the first lease's try
        mkdir -p "/tmp/ray-data/$c"
        files=(data/cifar10/train/$c/*)
        cp "${files[@]:0:300}" "/tmp/ray-data/$c/"
    done
    setsid "$PY" -c "import sys; from ray.scripts.scripts import main; sys.argv = ['ray', 'start', '--head', \
'--block', '--num-gpus', '$gpus', '--port', '6390']; main()" > /tmp/ray-head.log 2>&1 &
    local head=$!
    sleep 15
    set +e
    local small=(--dataset folder:/tmp/ray-data --preset cifar-s --epochs 2 --batch-size 128)
    /usr/bin/time -f "vit.train --ray (gpus per worker $gpus): %e s wall" "$PY" -m vit.train \
        --ray http://127.0.0.1:8265 --workers 1 --gpus-per-worker "$gpus" "${small[@]}" --val-fraction 0.2 --out /tmp/ray-run
    tail -2 /tmp/ray-run/metrics.jsonl; grep -o '"device": "[^"]*"' /tmp/ray-run/status.json
    /usr/bin/time -f "vit.train --ray resume: %e s wall" "$PY" -m vit.train --resume /tmp/ray-run --epochs 3 \
        --ray http://127.0.0.1:8265
    tail -1 /tmp/ray-run/metrics.jsonl
    # vit.analyze through Ray Data's actors (a GPU each where the cluster has them), then in this process.
    /usr/bin/time -f "vit.analyze --ray: %e s wall" "$PY" -m vit.analyze checkpoints/cifar10-cifar-s.pt \
        --data /tmp/ray-data --ray http://127.0.0.1:8265 --workers 1 --out /tmp/ray-analysis
    /usr/bin/time -f "vit.analyze here: %e s wall" "$PY" -m vit.analyze checkpoints/cifar10-cifar-s.pt \
        --data /tmp/ray-data --out /tmp/local-analysis
    ls /tmp/ray-analysis
    set -e
    kill -TERM -- -"$head" 2>/dev/null
    tail -3 /tmp/ray-head.log
}

finish() {
    T0=$SECONDS
    # Let the runs end at their deadline; stop any that would eat the quiet-GPU bench's time.
    sweep_until $((DEADLINE - 150))
    $PY "${SWEEP[@]}" stop 40
    $PY "${SWEEP[@]}" status 2>&1 | tee "$OUT/final-status.txt"
    $PY "${SWEEP[@]}" collect "$OUT" 2>&1 | tee -a "$OUT/final-status.txt"
    set +e
    # CUDA graphs (the issue's third column) on a quiet GPU again.
    timeout $((DEADLINE - 10 - (SECONDS - T0))) $PY bench/bench_gpu.py --device cuda --compile \
        --compile-mode reduce-overhead --models cifar-m,vit-base-16 --cifar data/cifar10/train --skip-augmentation \
        2>&1 | tee "$OUT/bench-reduce-overhead.txt"
    set -e
}

DATA=${DATA:-data/cifar10/train}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-runs/gpu-default}

one_recipe() {  # $1 a recipe of bench/train_gpu_default.py, $2 where its files go: unpack, then decode, train alone
    # with --time-budget (DEADLINE less the decoding and a 15-s margin), vit.evaluate best.pt, collect
    if [ "$DATA" = data/cifar10/train ] && [ ! -d data/cifar10/train ]; then
        mkdir -p data/cifar10
        tar -xzf data/shared/cifar10/train.tar.gz -C data/cifar10
    fi
    local extra=()
    read -ra extra <<< "${EXTRA:-}"
    mkdir -p "$2"
    $PY bench/train_gpu_default.py --recipe "$1" --data "$DATA" --out "$2" --work "$WORK/$1" --device "$DEVICE" \
        --deadline "${DEADLINE:-570}" --margin 15 ${extra[@]+--extra "${extra[@]}"} 2>&1 | tee "$2/console.txt"
}

default() {
    one_recipe default "$OUT"
}

record() {  # each recipe named (default: lee, then lee-ours) alone, one after the other, its files in $OUT/NAME
    local name failed=0
    local names=("$@")
    [ ${#names[@]} -gt 0 ] || names=(lee lee-ours)
    for name in "${names[@]}"; do
        case "$name" in lee|lee-ours) ;; *) echo "record: unknown recipe $name (lee or lee-ours)" >&2; return 2 ;; esac
    done
    for name in "${names[@]}"; do
        one_recipe "$name" "$OUT/$name" || failed=1
    done
    return "$failed"
}

case "${1:-}" in
    default) default ;;
    record) shift; record "$@" ;;
    stage) stage "${2:-}" ;;
    setup) setup ;;
    tests) tests ;;
    bench) bench ;;
    start) start ;;
    watch) watch ;;
    ray) ray ;;
    finish) finish ;;
    *) echo "usage: $0 default|record [lee|lee-ours]|stage|setup|tests|bench|start|watch|ray|finish" >&2; exit 2 ;;
esac
