#!/usr/bin/env bash
# #28's CPU tables on the Intel Xeon that hosts a lent GPU, pinned to two of its cores: the other CPU kind these
# machines come in (2 cores, AVX-512), which no session here has had. The GPU is not used.
#   here:    bash benchmarks/scripts/xeon_cpu.sh pack         # .gpu/xeon (git-ignored): the ninja wheel torch's
#                                                             # builds need
#   device:  bash benchmarks/scripts/xeon_cpu.sh run OUT_DIR  # carry .gpu/xeon: build the C++ kernels on every core,
#                                                             # then the training and memory tables on two, each
#                                                             # step time-boxed
# The kernels are built for this host (-march=native) with its compiler; without one they fall back to the PyTorch
# forms, which the log says (every kernel's build line). The machine's own torch runs (a CUDA build: CPU kernels are
# the same ATen, but name its version beside the table). One log and the tables' files land in OUT_DIR.
set -u
stage=${1:?usage: bash benchmarks/scripts/xeon_cpu.sh pack | run OUT_DIR}
cores=${POSENC_BENCH_CORES:-0,1}  # the two cores the tables run on
biases=rope,alibi,sandwich,xpos,kerple,t5,fire,shaw,transformer_xl,cope

case $stage in
pack)
    rm -rf .gpu/xeon && mkdir -p .gpu/xeon
    exclude=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$exclude")" && touch "$exclude"
    grep -qx '/.gpu/' "$exclude" || echo /.gpu/ >> "$exclude"
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/xeon ninja==1.13.0 || exit 1
    ls -la .gpu/xeon
    ;;
run)
    out=${2:?OUT_DIR}
    mkdir -p "$out" /tmp/posenc-xeon
    steps=$(mktemp -d)
    log=$out/xeon.log
    python3 -m pip install -q --no-index --no-deps --target /tmp/posenc-xeon .gpu/xeon/*.whl > "$steps/pip.txt" 2>&1
    export PYTHONPATH=$PWD/src:/tmp/posenc-xeon PATH=/tmp/posenc-xeon/bin:$PATH PYTHONUNBUFFERED=1
    export POSENC_FORMS_CACHE=$out/forms-cache.json TORCH_EXTENSIONS_DIR=/tmp/posenc-xeon/extensions
    step() {  # step NAME SECONDS COMMAND...: time-boxed, then its exit, time and output into the log
        local name=$1 limit=$2 start=$SECONDS
        shift 2
        timeout "$limit" "$@" > "$steps/$name.txt" 2>&1
        local rc=$?
        { echo "== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"; cat "$steps/$name.txt"; } >> "$log"
    }
    { lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|L2|L3)"; grep -o -m1 'avx512[a-z_]*' /proc/cpuinfo | sort -u
      python3 -c "import torch; print('torch', torch.__version__, torch.backends.cpu.get_cpu_capability())"
      command -v g++ c++ ninja; g++ --version | head -1  # the device's .git is the session's first checkout:
      echo "kernel sources sha256 $(cat src/posenc/kernels/*.h src/posenc/kernels/*.cpp | sha256sum | cut -c1-16)"
      cat "$steps/pip.txt"; } > "$log" 2>&1
    # every kernel at once, one process each, on all cores: about 30 s each on two
    step build 150 bash -c 'for kernel in rope_cpu offset_bias offset_lookup gated_counts sticks; do
        python3 -c "from posenc.kernels import $kernel as k; m = k.extension(); print(\"$kernel\", m is not None)" &
    done; wait'
    export OMP_NUM_THREADS=2
    step bench 200 taskset -c "$cores" python3 -m posenc bench --device cpu --tables training,memory \
        --encodings $biases --train-shapes 64x32,512x8 --rounds 5 --json "$out/xeon.json" --markdown "$out/xeon.md"
    step bench-2048 120 taskset -c "$cores" python3 -m posenc bench --device cpu --tables training \
        --encodings rope,alibi,sandwich,xpos,kerple,t5 --train-shapes 2048x2 --rounds 5 \
        --json "$out/xeon-2048.json" --markdown "$out/xeon-2048.md"
    # the training table again, forms from the cache: the spread between two runs on the same machine
    step bench-again 100 taskset -c "$cores" python3 -m posenc bench --device cpu --tables training \
        --encodings $biases --train-shapes 64x32,512x8 --rounds 5 --json "$out/xeon-again.json" \
        --markdown "$out/xeon-again.md"
    grep -a "^== \|True\|False" "$log"
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
