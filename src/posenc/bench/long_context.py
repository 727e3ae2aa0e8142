"""Long-context attention, forward and backward, each contender in its own process, as a ratio to SDPA without
positions at the same shape (issue #53).

Contenders per (B, H, T, Dh) shape, in this order: ``sdpa (no positions)`` (``scaled_dot_product_attention`` with
``is_causal``: the floor and the baseline), ``flex (no positions)`` (FlexAttention with a causal block mask),
``flex + alibi score_mod`` (the ALiBi recipe a user writes: ``score + slope[h] * (kv_idx - q_idx)``), then
``posenc.attention(q, k, v, encoding, causal=True, backend="auto")`` for every encoding that acts inside attention
(FoX with random log forget gates, as its layer hands them over). Both flex rows are compiled on CUDA; FlexAttention
has no backward pass on CPU, so there they are error rows that say so.

A fresh ``python -m posenc.bench.long_context SPEC`` process measures each row, so an out-of-memory error or a
broken CUDA context ends that row only. An encoding ``register``ed from outside posenc is registered again in the
child from its class's module and its entry's fields (``registration``), so it is timed like posenc's own; a child that fails, crashes or runs past its timeout leaves an error row
(``"error"`` instead of ``"ms"``). In the child: random q, k, v (B, H, T, Dh) in the dtype, requires_grad, and one
fixed random gradient of the output; two warm-up calls (compiles, ``kernels.dispatch``'s first-use timing), then
``calls`` timed calls of forward + ``backward``, median ms. ``peak_gib``: CUDA's peak allocated memory during the
timed calls above what was allocated before them (inputs, parameters and caches excluded; the gradients of q, k, v
and of the encoding's parameters included); None on CPU, which has no such counter.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..attention import attention
from ..encodings import alibi_slopes, build_for_model
from ..encodings.registry import ENTRIES, Entry, one_axis, register
from ..lm.runtime import cpu_model, git_commit
from .timing import round_robin

SHAPES = ((1, 16, 16384, 64), (4, 16, 4096, 64))  # (B, H, T, Dh): one long sequence, and a batch of shorter ones
BASELINE = "sdpa (no positions)"
FLEX = ("flex (no positions)", "flex + alibi score_mod")
WARMUP = 2
ERROR_CHARS = 160  # an error row's message is its first line, cut here


def _flex(name: str, q: torch.Tensor) -> Callable[..., torch.Tensor]:
    """A FlexAttention contender as its documentation shows it: the causal block mask built once, outside the
    timing; compiled on CUDA. ``q``: (B, H, T, Dh). Returns f(q, k, v) -> (B, H, T, Dh)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    length = q.shape[2]
    block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None, length, length,
                                   device=q.device)
    kernel = torch.compile(flex_attention, dynamic=False) if q.is_cuda else flex_attention
    if name == "flex (no positions)":
        return lambda q, k, v: kernel(q, k, v, block_mask=block_mask)
    slopes = alibi_slopes(q.shape[1]).to(q.device, torch.float32)  # (H,)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return lambda q, k, v: kernel(q, k, v, score_mod=alibi, block_mask=block_mask)


def _contender(name: str, q: torch.Tensor) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
    """(f(q, k, v) -> (B, H, T, Dh), the other leaves its backward reaches) for a contender; ``q``: (B, H, T, Dh).

    An encoding's parameters stay float32 whatever the inputs' dtype, as in a model trained under autocast."""
    if name == BASELINE:
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), []
    if name in FLEX:
        return _flex(name, q), []
    batch, heads, length, head_dim = q.shape
    sizes = {"head_dim": head_dim, "num_heads": heads, "dim": heads * head_dim, "max_positions": length}
    encoding = build_for_model(name, sizes=sizes).to(q.device)
    leaves = list(encoding.parameters())
    if not encoding.has_token_gates:
        return (lambda q, k, v: attention(q, k, v, encoding, causal=True, backend="auto")), leaves
    # FoX: random log forget gates, as a layer hands its own to attention (positioned anew per call, as per layer)
    log_forget = F.logsigmoid(torch.randn(batch, heads, length, device=q.device)).requires_grad_()  # (B, H, T)
    positions = torch.arange(length, device=q.device)  # (T,)
    gated = lambda: encoding.at(positions, positions, contiguous=True).with_gates(log_forget)  # noqa: E731
    return (lambda q, k, v: attention(q, k, v, gated(), causal=True, backend="auto")), leaves + [log_forget]


def measure(name: str, shape: list[int], device: str, dtype: str, calls: int) -> dict:
    """{"ms": median of ``calls`` timed forward + backward calls, "peak_gib": None on CPU} for one contender."""
    device, dtype = torch.device(device), getattr(torch, dtype)
    torch.manual_seed(0)
    q, k, v = (torch.randn(*shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))  # (B, H, T, Dh)
    grad = torch.randn(*shape, device=device, dtype=dtype)  # (B, H, T, Dh), the output's upstream gradient
    attend, leaves = _contender(name, q)
    leaves += [q, k, v]

    def step() -> None:
        for leaf in leaves:  # each call makes its own gradients: their memory is part of its peak
            leaf.grad = None
        attend(q, k, v).backward(grad)

    for _ in range(WARMUP):
        step()
    for leaf in leaves:
        leaf.grad = None
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    ms = round_robin({name: step}, baseline=name, rounds=calls, device=device, warmup=0, label=name)[name]["ms"]
    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**30 if cuda else None
    return {"ms": ms, "peak_gib": peak}


def _short(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    if isinstance(error, torch.OutOfMemoryError):
        return f"out of memory: {first}"[:ERROR_CHARS]
    return f"{type(error).__name__}: {first}"[:ERROR_CHARS]


def registration(name: str) -> dict | None:
    """What a fresh process needs to build an encoding ``register``ed from outside posenc: {"module", "class",
    "entry": the entry's other fields}; None for posenc's own and for the baseline rows.

    Raises:
        ValueError: its class cannot be imported by name from a module (defined in a script or in a function).
    """
    entry = ENTRIES.get(name)
    if entry is None or entry.cls.__module__.split(".")[0] == __package__.split(".")[0]:
        return None
    module, qualname = entry.cls.__module__, entry.cls.__qualname__
    if module == "__main__" or "." in qualname:
        raise ValueError(f"encoding {name!r}: its class {qualname} is defined in {module}, which a fresh process "
                         f"cannot import; define it at the top level of a module to time it here")
    fields = {field.name: getattr(entry, field.name) for field in dataclasses.fields(Entry) if field.name != "cls"}
    return {"module": module, "class": qualname, "entry": fields}


def _register_again(spec: dict) -> None:
    """In the child: import the class of a registered encoding and register it, unless importing did."""
    found = getattr(importlib.import_module(spec["module"]), spec["class"])
    if spec["entry"]["name"] not in ENTRIES:
        register(Entry(cls=found, **spec["entry"]))


def main(argv: list[str]) -> int:
    """The child: measure the contender that the JSON ``argv[0]`` names (``measure``'s arguments, and
    ``registration``'s answer), print one JSON line: {"ms", "peak_gib"}, or {"error"}."""
    try:
        spec = json.loads(argv[0])
        registered = spec.pop("registration", None)
        if registered is not None:
            _register_again(registered)
        result = measure(**spec)
    except Exception as error:  # noqa: BLE001 - any failure is this row's error, and the parent goes on
        result = {"error": _short(error)}
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


def outcome(returncode: int, stdout: str, stderr: str) -> dict:
    """What a finished child reported: its JSON line, else an error from its exit code and stderr's last line (a
    crash)."""
    for line in reversed(stdout.splitlines()):
        try:
            reported = json.loads(line)
        except ValueError:
            continue
        if isinstance(reported, dict) and ("ms" in reported or "error" in reported):
            return reported
    last = [line.strip() for line in stderr.splitlines() if line.strip()] or ["no output"]
    return {"error": f"exited with code {returncode}: {last[-1]}"[:ERROR_CHARS]}


def run_child(name: str, shape: tuple[int, ...], device: str, dtype: str, calls: int, timeout: float) -> dict:
    """One contender in a fresh process, killed after ``timeout`` seconds."""
    try:
        registered = registration(name)
    except ValueError as error:
        return {"error": str(error)[:ERROR_CHARS]}
    spec = json.dumps({"name": name, "shape": list(shape), "device": device, "dtype": dtype, "calls": calls,
                       **({"registration": registered} if registered else {})})
    # the folder holding this posenc, then every folder the parent imports from (a registered encoding's module may
    # sit beside the script that registered it): the child imports what the parent does
    paths = [str(Path(__file__).resolve().parents[2]), *(p for p in sys.path if isinstance(p, str)),
             os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(filter(None, paths))),
           "TQDM_DISABLE": "1"}  # no progress bars in its stderr, whose last line names a crash
    try:  # killed on a timeout or an interrupt; torch.compile's workers end with it
        child = subprocess.run([sys.executable, "-m", "posenc.bench.long_context", spec], capture_output=True,
                               text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    return outcome(child.returncode, child.stdout, child.stderr)


def timed_encodings() -> tuple[str, ...]:
    """Every encoding that acts inside attention, FoX and any ``register``ed one among them: the rows this table
    times."""
    return one_axis(in_attention=True)


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else cpu_model()


def bench_long_context(device: str = "cpu", dtype: str = "float32", shapes=SHAPES, encodings=None,
                       calls: int = 7, timeout: float = 120.0, on_row: Callable[[list[dict]], None] | None = None
                       ) -> list[dict]:
    """Rows {encoding, B, H, T, Dh, ms | error, x_sdpa_nope, peak_gib, device, commit, dtype, torch}, SDPA first
    per shape; ``x_sdpa_nope``: ms / SDPA's ms at that shape (None where either is missing). Prints a line per row
    as it ends and calls ``on_row(rows so far)``. ``encodings``: names (default: ``timed_encodings()``)."""
    facts = {"device": device_name(device), "commit": git_commit(), "dtype": dtype, "torch": torch.__version__}
    rows = []
    for shape in shapes:
        floor = None
        for name in (BASELINE, *FLEX, *(timed_encodings() if encodings is None else encodings)):
            started = time.perf_counter()
            result = run_child(name, shape, device, dtype, calls, timeout)
            floor = result.get("ms") if name == BASELINE else floor
            timed = {"ms": result["ms"]} if "ms" in result else {"error": result["error"]}
            ratio = result["ms"] / floor if "ms" in result and floor else None
            rows.append({"encoding": name, **dict(zip(("B", "H", "T", "Dh"), shape)), **timed, "x_sdpa_nope": ratio,
                         "peak_gib": result.get("peak_gib"), **facts})
            said = f"{result['ms']:.2f} ms" if "ms" in result else f"error: {result['error']}"
            print(f"long {'x'.join(map(str, shape))} {name}: {said} ({time.perf_counter() - started:.0f} s)",
                  file=sys.stderr, flush=True)
            if on_row is not None:
                on_row(rows)
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
