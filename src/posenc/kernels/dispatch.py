"""Which form runs a score term, chosen by timing the forms at first use on this machine (CPU or GPU).

A score bias or content-position term can run in several forms (``attention`` builds them): ``table`` (the
bias inside ``offset_bias``'s kernel), ``channels`` (the terms as extra q/k channels), ``mask`` (a float mask
on SDPA or on the blockwise kernel), ``counts`` (CoPE inside ``gated_counts``' kernel, the one form offered
where it serves), ``lookups`` (Transformer-XL's terms inside ``offset_lookup``'s kernel) and ``gates`` (FoX's
c_i − c_j inside ``offset_bias``' kernel, the one form offered where it serves); on a GPU ``tiles`` (an offset table
or FoX's token values inside ``tiles_triton``'s Triton tiles), ``channels``, ``mask`` (SDPA with a float mask),
``flex`` (the bias as FlexAttention's compiled ``score_mod``) and ``blocks`` (the dense path by query blocks, where
the mask would pass ``query_blocks``' budget and nothing else serves: the one form offered then). Which is fastest depends on
the CPU (an AMD EPYC and an Intel Xeon disagree) or GPU,
the shape and whether a gradient is needed, so no threshold is written down: the first call with a new key
(encoding, shape bucket, dtype, gradient) times every form that serves it, round-robin, forward and backward on
random tensors of that shape, runs the fastest and remembers it, in memory and in a JSON file, ``POSENC_FORMS_CACHE``
(default ``~/.cache/posenc/attention-forms.json``). An entry measured under another torch, CPU or kernel source is
stale and timed again. ``POSENC_ATTENTION_FORM`` (or ``force``) makes one form run wherever it serves.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .. import checks, storage
from . import native

FORMS = ("table", "channels", "mask", "counts", "lookups", "gates", "segments", "tiles", "flex", "blocks")
FORCE_VARIABLE = "POSENC_ATTENTION_FORM"
CACHE_VARIABLE = "POSENC_FORMS_CACHE"
ROUNDS = 3  # timed rounds after one warm-up call of each form: a few milliseconds to a second, once per key

_chosen: dict[str, str] = {}  # this process's choices, by key
_forced: list[str] = []


def cache_path() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "posenc" / "attention-forms.json")


def fingerprint(kernels: Path = Path(__file__).parent) -> str:
    """What a timing is only valid for: torch, the CPU and the kernels' sources (in ``kernels``, this folder): the C++
    ones and the Python kernels that are timed forms (``blockwise``, ``tiles_*``)."""
    python = [path for path in [kernels / "blockwise.py"] if path.exists()] + sorted(kernels.glob("tiles_*.py"))
    sources = sorted(kernels.glob("*.cpp")) + sorted(kernels.glob("*.h")) + python
    parts = [torch.__version__, native.cpu_identity(), *(path.read_text() for path in sources)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def bucket(n: int) -> int:
    """Sizes within a factor of two share a timing: the next power of two."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def shape_key(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, needs_grad: bool) -> str:
    """The key a choice is remembered under: q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv)."""
    batch, heads, queries, width = q.shape
    gpu = f"{torch.cuda.get_device_name(q.device)} " if q.is_cuda else ""  # a CPU's choice carries the fingerprint's CPU
    return (f"{gpu}{name} {str(q.dtype).removeprefix('torch.')} {'causal' if causal else 'bidirectional'} "
            f"{'train' if needs_grad else 'infer'} B·H={bucket(batch * heads)} Hkv={k.shape[1]} Tq={bucket(queries)} "
            f"Tk={bucket(k.shape[2])} Dh={width} Dv={v.shape[-1]}")


def forced_form() -> str | None:
    """The form ``force`` or ``POSENC_ATTENTION_FORM`` names, if any."""
    if _forced:
        return _forced[-1]
    value = os.environ.get(FORCE_VARIABLE)
    return checks.choice(FORCE_VARIABLE, value, FORMS) if value else None


@contextlib.contextmanager
def force(form: str) -> Iterator[None]:
    """Within the block, ``form`` runs wherever it serves (benchmarks, tests)."""
    _forced.append(checks.choice("form", form, FORMS))
    try:
        yield
    finally:
        _forced.pop()


def chosen() -> dict[str, str]:
    """The choices made in this process: {key: form}."""
    return dict(_chosen)


def choose(key: str, forms: list[str], stand_ins: Callable[[], dict[str, Callable[[], object]]]) -> str:
    """The form to run under ``key``, one of ``forms``: the only one, the forced one, the remembered one, or the
    fastest of a timing now (then remembered). ``stand_ins()``: {form: a call that runs it once on stand-in
    tensors}, made only when a timing is needed."""
    if len(forms) == 1:
        _chosen[key] = forms[0]  # nothing to time, but ``chosen`` names what ran
        return forms[0]
    forced = forced_form()
    if forced in forms:
        return forced
    if _chosen.get(key) in forms:
        return _chosen[key]
    stamp = fingerprint()
    entry = _read().get(key)
    if entry and entry.get("fingerprint") == stamp and entry.get("form") in forms:
        _chosen[key] = entry["form"]
        return entry["form"]
    ms = time_forms(stand_ins())
    _chosen[key] = min(ms, key=ms.get)
    _write(key, {"form": _chosen[key], "ms": {name: round(t, 4) for name, t in ms.items()}, "fingerprint": stamp})
    return _chosen[key]


def stand_ins(forms: dict, q, k, v, at, arguments: tuple, needs_grad: bool) -> dict:
    """{name: a call that runs ``forms[name](q, k, v, at, *arguments)`` once on random tensors shaped as q, k and v
    (``at``: the positioned encoding), backward too when a gradient is needed, with no gradient left on the
    encoding's parameters."""
    q_, k_, v_ = (torch.randn_like(x).requires_grad_(needs_grad) for x in (q, k, v))
    parameters = [p for p in at.encoding.parameters() if p.requires_grad] if needs_grad else []
    return {name: _stand_in(form, q_, k_, v_, at, arguments, needs_grad, parameters) for name, form in forms.items()}


def _stand_in(form, q_, k_, v_, at, arguments: tuple, needs_grad: bool, parameters: list):
    def run():  # outside any saved-tensor hooks of the caller's (a memory count), and with its own tables
        with torch.set_grad_enabled(needs_grad), torch.autograd.graph.saved_tensors_hooks(_same, _same):
            out = form(q_, k_, v_, at.unmemoized(), *arguments)
            if needs_grad:
                torch.autograd.grad(out.sum(), [q_, k_, v_, *parameters], allow_unused=True)
    return run


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _form_failures() -> tuple[type[BaseException], ...]:
    """The errors a form may raise at first use and be left out for: torch's (an out-of-memory error is a
    RuntimeError), a refused shape, and Triton's compile and resource errors (OutOfResources, CompilationError and
    PTXASError derive from ``TritonError``, not from RuntimeError)."""
    errors: tuple[type[BaseException], ...] = (RuntimeError, ValueError, NotImplementedError)
    try:
        from triton.errors import TritonError
    except ImportError:
        return errors
    return (*errors, TritonError)


def time_forms(contenders: dict[str, Callable[[], object]], rounds: int = ROUNDS) -> dict[str, float]:
    """Median milliseconds of each form, one call of each per round, after one warm-up call of each (which compiles
    what compiles); GPU work is waited for inside each timing. A form whose warm-up raises (out of memory, a
    compile error) is left out with one warning, and the others are timed; if none runs, the first error is
    raised."""
    failures = {}
    for name, run in contenders.items():
        try:
            run()
        except _form_failures() as error:
            failures[name] = error
            _synchronize_quietly()
    if len(failures) == len(contenders):
        raise next(iter(failures.values()))
    if failures:
        warnings.warn("posenc: attention forms left out of the timing after failing at first use: "
                      + "; ".join(f"{name}: {str(error).splitlines()[0][:120]}" for name, error in failures.items()),
                      RuntimeWarning, stacklevel=2)
    contenders = {name: run for name, run in contenders.items() if name not in failures}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            _synchronize()
            start = time.perf_counter()
            run()
            _synchronize()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) * 1e3 for name, times in samples.items()}


def _synchronize_quietly() -> None:
    """Let a failed form's queued GPU work end before the next runs (its error, if any, was the form's)."""
    try:
        _synchronize()
    except RuntimeError:
        pass


def _synchronize() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _read() -> dict:
    try:
        data = storage.read_json(cache_path())
    except (OSError, ValueError):  # absent or damaged: time again and write it anew
        return {}
    return data if isinstance(data, dict) else {}


def _write(key: str, entry: dict) -> None:
    data = _read()
    data[key] = entry
    try:
        storage.write_json(cache_path(), data)
    except OSError:  # a read-only home keeps the choice in memory only
        pass
