"""One-off A/B on a GPU: the tiny LM's RoPE training step with the tiled Triton kernel, the row-per-program kernel
it replaced (commit 48d8584, read with ``git show``), and the eager rotation, against NoPE, round-robin in one run.
On an H200 the three were equal, because the model's in-place rotation never takes the Triton branch these patch
(benchmarks/history.md, the second lend): kept as the evidence for that sentence.

    PYTHONPATH=src python3 benchmarks/scripts/gpu_rope_ab.py
"""

import contextlib
import importlib.util
import subprocess
import sys
import tempfile

import torch

from posenc.bench.timing import round_robin
from posenc.bench.training import _loss, _model
from posenc.encodings import rotary

SHAPES = ((512, 16), (2048, 4), (8192, 1))


def row_kernel():
    """``rope_qk_triton`` as it was at 48d8584: one program per (batch, position, head) row."""
    source = subprocess.run(["git", "show", "48d8584:src/posenc/kernels/rope_triton.py"], check=True,
                            capture_output=True, text=True).stdout
    path = tempfile.NamedTemporaryFile("w", suffix="_row_rope.py", delete=False)
    path.write(source)
    path.close()
    spec = importlib.util.spec_from_file_location("row_rope", path.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules["row_rope"] = module
    spec.loader.exec_module(module)
    return module.rope_qk_triton


@contextlib.contextmanager
def patched(**attributes):
    saved = {name: getattr(rotary, name) for name in attributes}
    for name, value in attributes.items():
        setattr(rotary, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(rotary, name, value)


def main() -> None:
    device = torch.device("cuda")
    variants = {"none": {}, "rope tiled": {}, "rope row kernel": {"rope_qk_triton": row_kernel()},
                "rope eager": {"triton_available": lambda: False}}
    for length, batch in SHAPES:
        tokens = torch.randint(0, 256, (batch, length + 1), device=device)
        contenders = {}
        for name, patch in variants.items():
            model = _model("none" if name == "none" else "rope", length, device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step(model=model, optimizer=optimizer, patch=patch):
                with patched(**patch):
                    optimizer.zero_grad(set_to_none=True)
                    _loss(model, tokens, torch.bfloat16).backward()
                    optimizer.step()

            contenders[name] = step
        timed = round_robin(contenders, baseline="none", rounds=15, device=device, warmup=3, label=f"L={length}")
        for name, numbers in timed.items():
            print(f"L={length} B={batch} {name:16s} {numbers['ms']:6.2f} ms  {numbers['ratio']:.2f} "
                  f"({numbers['ratio_low']:.2f}-{numbers['ratio_high']:.2f})")


if __name__ == "__main__":
    main()
