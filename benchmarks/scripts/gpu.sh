#!/usr/bin/env bash
# The GPU checks and tables in one call of a lent machine, each step time-boxed so a slow one cannot eat the rest.
#   bash benchmarks/scripts/gpu.sh OUT_DIR [STEP...]    (no STEP: every step, in this order)
# Steps: tests, sweep (the Triton tiles' settings, gpu_tiles_sweep.py), bench-auto, bench-flex, rope, rope-launch,
# verify, long (the long-context table at (1, 16, 16,384, 64), each row in its own process: gpu-long.json,
# gpu-long.md), long-batch (the same at (4, 16, 4,096, 64), merged into gpu-long.json), long-65k (the same at
# (1, 16, 65,536, 64): the goal that every encoding runs there within an H100's 80 GB); tests-tiles runs only the
# CUDA tests of the Triton tiles and of the dense paths by query blocks; unchecked runs the CUDA tests of the Triton
# kernels a GPU has not yet run (FIRE's tiles; stick-breaking's, sticks_triton; Transformer-XL's and Shaw's,
# lookups_triton; CoPE's, counts_triton; offered on a GPU only with POSENC_STICKS_TRITON=1, POSENC_LOOKUPS_TRITON=1,
# POSENC_COUNTS_TRITON=1 until checked there, which it sets), then their long rows. The long tables offer every
# unchecked kernel. Every step together takes more than one call's 10 minutes: name the steps a call has time for
# (unchecked alone, at most 440 s, is the next lend's first call; tests-tiles long its second).
# 1. tests/test_cuda.py (Triton RoPE, every backend and form forward and backward against float64 on the CPU, forms
#    timed on the GPU, the tiny LM, posenc pretrained against the CPU); 2. `posenc bench` in bf16 on the auto backend (its
#    forms timed at first use) for the bias encodings; 3. the same training step with FlexAttention forced; 4. RoPE
#    apply, the Triton kernel among the contenders, then its device time apart from its launch (gpu_rope_probe.py);
#    5. `posenc verify --device cuda`.
# The machine receives the working tree beside the git metadata of an older commit: name the tree's commit with
# POSENC_SOURCE_COMMIT=$(git rev-parse HEAD) in the call (on a clean tree), so the log and every row carry it.
# It uses the machine's own torch/Triton/transformers and this checkout's source (no install); the CPU kernels stay
# off, since the CPU only computes the float64 references here. One log and the tables' files land in OUT_DIR.
set -u
out=${1:?usage: bash benchmarks/scripts/gpu.sh OUT_DIR}
mkdir -p "$out"
steps=$(mktemp -d)  # each step's output, appended whole to the one log when it ends (few files come back)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 POSENC_CPU_KERNELS=0 POSENC_FORMS_CACHE=$out/forms-cache.json
log=$out/gpu.log
biases=alibi,t5,kerple,sandwich,fire,transformer_xl
shapes=512x16,2048x4,8192x1

step() {  # step NAME SECONDS COMMAND...: run it time-boxed, then its exit, time and output into the log
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@" > "$steps/$name.txt" 2>&1
    local rc=$?
    { echo "== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"; cat "$steps/$name.txt"; } >> "$log"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import platform, torch, triton, transformers; print('python', platform.python_version(), 'torch',
torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  echo "commit ${POSENC_SOURCE_COMMIT:-$(git log -1 --format=%H 2>/dev/null) (the git metadata sent along)}"; } > "$log" 2>&1

wanted=${*:2}
wanted=${wanted:-tests sweep bench-auto bench-flex rope rope-launch verify long}
chosen() { [[ " $wanted " == *" $1 "* ]]; }

chosen tests-tiles && step tests-tiles 140 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda.py \
    -k "triton_tiles or query_blocks"
chosen tests && step tests 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_cuda.py
# the kernels not yet checked on a GPU, offered by their switches: their CUDA tests in one run, then their long rows
unchecked=(env POSENC_STICKS_TRITON=1 POSENC_LOOKUPS_TRITON=1 POSENC_COUNTS_TRITON=1)
chosen unchecked && step unchecked-tests 200 "${unchecked[@]}" python3 -m pytest -q -p no:cacheprovider -n 8 \
    tests/test_cuda.py -k "fire or stick or lookups_in_triton or cope_in_triton"
chosen unchecked && step unchecked-long 240 "${unchecked[@]}" python3 -m posenc bench --device cuda \
    --dtype bfloat16 --tables long --long-shapes 1x16x16384x64 --rounds 5 --long-timeout 45 \
    --encodings fire,stick-breaking,transformer_xl,shaw,cope --long-json "$out/gpu-long-unchecked.json" \
    --markdown "$out/unchecked-long.md"
chosen sweep && step sweep 150 python3 benchmarks/scripts/gpu_tiles_sweep.py
chosen bench-auto && step bench-auto 130 python3 -m posenc bench --device cuda --dtype bfloat16 --tables training,memory,attention \
    --encodings $biases --train-shapes $shapes --lengths 1024,4096 --rounds 10 \
    --json "$out/bench-cuda-auto.json" --markdown "$out/bench-cuda-auto.md"
chosen bench-flex && step bench-flex 70 python3 -m posenc bench --device cuda --dtype bfloat16 --tables training --backend flex \
    --encodings ${biases%,transformer_xl} --train-shapes $shapes --rounds 10 \
    --json "$out/bench-cuda-flex.json" --markdown "$out/bench-cuda-flex.md"
chosen rope && step rope 40 python3 -m posenc bench --device cuda --dtype bfloat16 --tables rope --rounds 20 \
    --json "$out/bench-cuda-rope.json"
chosen rope-launch && step rope-launch 30 python3 benchmarks/scripts/gpu_rope_probe.py
chosen verify && step verify 70 python3 -m posenc verify --device cuda --json "$out/verify-cuda.json"
long() {  # long STEP SECONDS SHAPE: one shape's long table, merged into gpu-long.json
    step "$1" "$2" "${unchecked[@]}" python3 -m posenc bench \
        --device cuda --dtype bfloat16 --tables long --long-shapes "$3" --rounds 5 --long-timeout 45 \
        --long-json "$out/gpu-long.json" --markdown "$out/$1.md"
}
chosen long && long long 240 1x16x16384x64
chosen long-batch && long long-batch 190 4x16x4096x64
chosen long-65k && long long-65k 420 1x16x65536x64
grep -a "^== \|passed\|failed" "$log"
