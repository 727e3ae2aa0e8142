"""Every Triton program of posenc compiled for a GPU target with no GPU present: the launches a set of calls makes
under the interpreter are recorded (argument types and compile-time constants, at the GPU's own tile sizes), then
each is compiled to a cubin by Triton's own compiler and ptxas, as the first call on an H100 or H200 would.

The interpreter runs the programs' Python; it cannot show that Triton's compiler accepts them (a branch whose
values differ in type, a gather in a layout it cannot lower) or that their tiles fit the GPU's shared memory. This
does, without a lend. Run as ``python -m tests.kernels.triton_targets record FILE [--all] [--float32] [--widths
W,...]`` under TRITON_INTERPRET=1, then ``python -m tests.kernels.triton_targets compile FILE`` (JSON) or ``table
FILE...`` (Markdown, with each program's registers and spills) without it (one process cannot do both: the
interpreter is chosen when Triton is imported); ``make gpu-compile`` does both with the GPU's own Triton version,
at every head width where a kernel's size rule changes. ``--float32`` records float32 (at width 64 unless
``--widths``); compiling it takes about 4 minutes on two cores, so the suite leaves it out.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

#: the GPU compiled for: an H100/H200 (compute capability 9.0, 32-thread warps), and its shared memory per block
TARGET = ("cuda", 90, 32)
SHARED_BYTES = 232_448


class AsIfOnGpu:
    """A tensor seen by the kernels' size rules as if it sat on a GPU: their tile sizes, warps and product kind."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor
        self.device = SimpleNamespace(type="cuda")
        self.is_cuda = True

    def __getattr__(self, name):
        return getattr(self._tensor, name)


def gpu_sizes() -> None:
    """The kernels' size rules answer as on a GPU (the launches then carry a GPU's tile sizes)."""
    from posenc.kernels import counts_triton, lookups_triton, sticks_triton, tiles_triton

    def as_if_on_gpu(rule):
        return lambda q, *rest: rule(AsIfOnGpu(q), *rest)

    for module, name in ((tiles_triton, "_blocks"), (tiles_triton, "product_kind"), (sticks_triton, "_sizes"),
                         (lookups_triton, "_sizes"), (counts_triton, "_sizes")):
        setattr(module, name, as_if_on_gpu(getattr(module, name)))


def specialized(value) -> tuple[str, str | None]:
    """How the JIT on a GPU specializes an argument (``JITFunction.run``): its type, "constexpr" for an int of 1,
    and "D" where it is a multiple of 16 (an int) or 16-byte aligned (a tensor), which lets the compiler vectorize
    loads and stores. Compiled without these, a program is not the one a GPU runs: its registers and spills differ."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    kind, hint = native_specialize_impl(BaseBackend, value, False, True, True)
    return kind, hint if isinstance(hint, str) and hint else None


@contextlib.contextmanager
def recording():
    """While inside, each distinct launch is recorded, specialized as the GPU's JIT would (``specialized``), and not
    run: yields the launches, a dict of {"module", "name", "signature", "constants", "divisible", "options"} filled
    as they are made. What a GPU compiles depends on the arguments' types, alignment and constants, never on the
    values a launch writes: run or not, ``record --all`` made the same 124 launches (and 114 in float32 at widths
    64 and 128, in bf16 at 8 and 256), recorded in 0.2 s where the interpreter took 54 (2-core AMD EPYC). Outputs
    are left as allocated, so only the launches recorded mean anything."""
    from triton.runtime.interpreter import InterpretedFunction

    launches = {}
    run = InterpretedFunction.run

    def recorded_run(self, *args, grid, warmup, **kwargs):  # noqa: ARG001 - the interpreter's signature
        fn = self.fn
        parameters = inspect.signature(fn).parameters
        bound = dict(zip(parameters, args))
        options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages") if key in kwargs}
        bound.update(kwargs)
        constants = {name: value for name, value in bound.items() if "constexpr" in str(parameters[name].annotation)}
        signature, divisible = {}, []
        for name, value in bound.items():
            kind, hint = ("constexpr", None) if name in constants else specialized(value)
            if kind == "constexpr" and name not in constants:  # an int of 1, made a constant by the GPU's JIT
                constants[name] = value
            signature[name] = kind
            if hint == "D":
                divisible.append(name)
        entry = {"module": fn.__module__, "name": fn.__name__, "signature": signature, "constants": constants,
                 "divisible": divisible, "options": options}
        launches[json.dumps(entry, sort_keys=True)] = entry

    InterpretedFunction.run = recorded_run
    try:
        yield launches
    finally:
        InterpretedFunction.run = run


def record(path: str, everything: bool = False, float32: bool = False, widths: tuple[int, ...] = ()) -> None:
    """Calls forward and backward of the Triton entry points in bfloat16 or float32 at each head width of ``widths``
    (by default 64 and 128 in bfloat16, 64 in float32) where ``forms`` offers the kernel (``offered_at``), and
    writes each distinct launch (``recording``). Only the kernels not yet run on a GPU (``unchecked``) unless
    ``everything``."""
    gpu_sizes()
    dtype = torch.float32 if float32 else torch.bfloat16
    with recording() as launches:
        for width in widths or ((64,) if float32 else (64, 128)):
            for family, entry in ENTRIES.items() if everything else unchecked():
                if offered_at(family, width, dtype):
                    torch.manual_seed(0)
                    entry(width, dtype)
    with open(path, "w") as file:
        json.dump(list(launches.values()), file)


def offered_at(family: str, width: int, dtype: torch.dtype) -> bool:
    """Whether the family's kernel is offered at this head width and dtype: within the widest its tiles fit a GPU's
    shared memory at (the module's ``WIDEST``; RoPE's rows are not tiled by the head)."""
    if family == "rope":
        return True
    from posenc.kernels.tiles_triton import fits_shared_memory

    module = importlib.import_module(f"posenc.kernels.{family}_triton")
    return fits_shared_memory(torch.empty(0, width, dtype=dtype), module.WIDEST)


HEADS, LENGTH = 4, 80
#: key/value heads: one per query head (a GPU's JIT then makes the group of 1 a constant: another program), and
#: one per two (grouped-query; never a single key/value head, which the JIT would make a constant too)
GROUPINGS = (HEADS, HEADS // 2)


def _tensors(width: int, dtype: torch.dtype, kv_heads: int = HEADS) -> list[torch.Tensor]:
    """q (1, HEADS, LENGTH, width), k and v (1, kv_heads, LENGTH, width) in ``dtype``, needing gradients."""
    return [(torch.randn(1, heads, LENGTH, width) * 0.5).to(dtype).requires_grad_()
            for heads in (HEADS, kv_heads, kv_heads)]


def _backward(out: torch.Tensor) -> None:
    out.float().sum().backward()


def _tiles(width: int, dtype: torch.dtype, kinds: tuple[str, ...] | None = None) -> None:
    """tiles_triton with each formula of ``kinds`` (all, and a table causally with flat far entries, at explicit
    positions and bidirectionally, and token values, where None)."""
    import posenc
    from posenc.kernels import tiles_triton

    linear = torch.stack([-0.5 ** torch.arange(1.0, HEADS + 1), torch.zeros(HEADS)], 1).requires_grad_()
    kerple = torch.stack([torch.linspace(0.5, 1.0, HEADS), torch.linspace(1.0, 0.5, HEADS)], 1).requires_grad_()
    formulas = {"linear": linear, "linear_abs": linear, "kerple_log": kerple, "kerple_power": kerple,
                "fire": posenc.build("fire", num_heads=HEADS).offset_formula()[1].detach().requires_grad_()}
    for kind in kinds or formulas:
        formula = tiles_triton.Formula(kind, formulas[kind])
        for kv_heads in GROUPINGS:
            _backward(tiles_triton.tiled_attention(*_tensors(width, dtype, kv_heads), scale=0.1, formula=formula))
    if kinds is not None:
        return
    table = torch.randn(HEADS, 2 * LENGTH, requires_grad=True)
    positions = {"q_pos": torch.arange(LENGTH)[None], "k_pos": torch.arange(LENGTH)[None]}
    _backward(tiles_triton.tiled_attention(*_tensors(width, dtype), scale=0.1, table=table[:, :LENGTH],
                                           flat=(-1, LENGTH // 2)))  # T5's: causal, its far offsets one entry
    _backward(tiles_triton.tiled_attention(*_tensors(width, dtype), scale=0.1, table=table, lowest=-LENGTH + 1,
                                           flat=(-1, LENGTH + 8), causal=False))
    _backward(tiles_triton.tiled_attention(*_tensors(width, dtype), scale=0.1, table=table, lowest=-LENGTH + 1,
                                           **positions))
    gates = torch.randn(1, HEADS, LENGTH, dtype=torch.float64).cumsum(-1).requires_grad_()
    _backward(tiles_triton.tiled_attention(*_tensors(width, dtype), scale=0.1, token_values=gates))


def _sticks(width: int, dtype: torch.dtype) -> None:
    from posenc.kernels import sticks_triton

    for current in (False, True):
        for kv_heads in GROUPINGS:
            _backward(sticks_triton.stick_breaking_attention(*_tensors(width, dtype, kv_heads), scale=0.1,
                                                             attend_current=current))


def _lookups(width: int, dtype: torch.dtype) -> None:
    """Transformer-XL's table with both shifts, and Shaw's band with value rows."""
    from posenc.kernels import lookups_triton

    shifts = {"content_shift": torch.randn(HEADS, width), "lookup_shift": torch.randn(HEADS, width)}
    for kv_heads in GROUPINGS:
        _backward(lookups_triton.lookup_attention(*_tensors(width, dtype, kv_heads),
                                                  torch.randn(HEADS, LENGTH, width, requires_grad=True), scale=0.1,
                                                  **shifts))
    band = [torch.randn(1, 16, width, requires_grad=True) for _ in range(2)]
    _backward(lookups_triton.lookup_attention(*_tensors(width, dtype), band[0], values=band[1], scale=0.1))


def _counts(width: int, dtype: torch.dtype) -> None:
    from posenc.kernels import counts_triton

    table = torch.randn(64, width, requires_grad=True)
    for kv_heads in GROUPINGS:
        _backward(counts_triton.counts_attention(*_tensors(width, dtype, kv_heads), table, scale=0.1,
                                                 gate_scale=width ** -0.5))


def _rope(width: int, dtype: torch.dtype) -> None:
    from posenc.kernels import rope_triton

    q, k, _ = _tensors(width, dtype, HEADS // 2)
    cos, sin = torch.randn(1, 1, LENGTH, width // 2), torch.randn(1, 1, LENGTH, width // 2)
    for layout in ("half", "interleaved"):
        rotated_q, rotated_k = rope_triton.rope_qk_triton(q, k, cos, sin, cos, sin, layout=layout)
        (rotated_q.float().sum() + rotated_k.float().sum()).backward()
        rope_triton.rope_qk_triton_(q.detach().clone(), k.detach().clone(), cos, sin, cos, sin, layout=layout)


ENTRIES = {"tiles": _tiles, "sticks": _sticks, "lookups": _lookups, "counts": _counts, "rope": _rope}


def unchecked() -> list[tuple[str, object]]:
    """(family, entry) of the kernels (and tile formulas) whose CUDA tests have not yet passed on a GPU."""
    from posenc.kernels import counts_triton, lookups_triton, sticks_triton, tiles_triton

    entries = [(name, ENTRIES[name]) for name, module in (("sticks", sticks_triton), ("lookups", lookups_triton),
                                                          ("counts", counts_triton)) if not module.CHECKED_ON_GPU]
    kinds = tuple(kind for kind in tiles_triton.FORMULAS if kind not in tiles_triton.CHECKED_ON_GPU)
    return entries + ([("tiles", lambda width, dtype: _tiles(width, dtype, kinds))] if kinds else [])


def compile_all(path: str) -> list[dict]:
    """Compiles every recorded launch for ``TARGET``; returns per launch {"name", "constants", "shared" (bytes per
    block), "registers" (per thread), "stack" (bytes per thread: registers spilled to local memory), "error"} and
    its options (warps, stages)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results = []
    with open(path) as file:
        launches = json.load(file)
    for launch in launches:
        fn = getattr(importlib.import_module(launch["module"]), launch["name"])
        divisible = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in launch["divisible"]}
        source = ASTSource(fn=fn, signature=launch["signature"], constexprs=launch["constants"], attrs=divisible)
        result = {"name": f"{launch['module'].rsplit('.', 1)[-1]}.{launch['name']}", "constants": launch["constants"],
                  "shared": None, "registers": None, "stack": None, "error": None, **launch["options"]}
        try:
            compiled = triton.compile(source, target=GPUTarget(*TARGET), options=launch["options"])
            result.update(shared=compiled.metadata.shared, **resource_usage(compiled.asm["cubin"]))
        except Exception as error:  # noqa: BLE001 — every failure is reported, with its launch
            result["error"] = f"{type(error).__name__}: {error}"[:2000]
        results.append(result)
    return results


def resource_usage(cubin: bytes) -> dict:
    """{"registers", "stack"} of a compiled program of one function, read by the cuobjdump Triton's wheel ships:
    registers per thread (255 at most) and its stack in bytes per thread, the local memory where ptxas puts the
    registers that did not fit (Triton's programs hold no other local arrays)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run([str(tool), "-res-usage", file.name], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"Function \S+:\s+REG:(\d+) STACK:(\d+)", usage)
    if len(found) != 1:
        raise ValueError(f"expected one function's resource usage from cuobjdump, got:\n{usage}")
    return {"registers": int(found[0][0]), "stack": int(found[0][1])}


#: the compile-time constants that tell a program's launches apart in ``table``
TELLING = ("HEAD_DIM", "BIAS", "CAUSAL", "CONTIGUOUS", "HAS_TOKENS", "TABLE_GRAD", "PARAM_GRAD", "TOKEN_GRAD",
           "HAS_VALUES", "CURRENT", "INTERLEAVED", "DOT", "group")


def table(paths: list[str]) -> tuple[str, bool]:
    """(a Markdown table of every launch recorded in ``paths``, compiled: its registers and stack bytes per thread,
    shared memory per block, or its error; whether all compiled within ``SHARED_BYTES``)."""
    import triton

    lines = [f"Compiled for sm_90 by Triton {triton.__version__}, no GPU. Stack: the local memory a thread needs, "
             "where ptxas puts the registers that did not fit (spilled).", "", *HEADER]
    fine = True
    for path in paths:
        for result in compile_all(path):
            fine = fine and result["error"] is None and result["shared"] <= SHARED_BYTES
            lines.append(row(result))
    return "\n".join(lines), fine


HEADER = ("| program | constants | tile | warps | stages | registers | stack bytes | shared KiB | error |",
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")


def row(result: dict) -> str:
    """One compiled launch as a row of ``HEADER``."""
    constants = ", ".join(f"{key}={result['constants'][key]}" for key in TELLING if key in result["constants"])
    shared = result["shared"]
    error = result["error"].splitlines()[0][:80].replace("|", "/") if result["error"] else ""
    return (f"| {result['name']} | {constants} | {tile(result['constants'])} | {result.get('num_warps', '')} | "
            f"{result.get('num_stages', '')} | {result['registers'] or ''} | "
            f"{'' if result['stack'] is None else result['stack']} | "
            f"{'' if shared is None else round(shared / 1024)} | {error} |")


def tile(constants: dict) -> str:
    """A launch's tile, queries × keys (RoPE's: positions × pairs), from its compile-time block sizes."""
    rows = constants.get("BLOCK_M", constants.get("BLOCK", constants.get("BLOCK_T")))
    columns = constants.get("BLOCK_N", constants.get("BLOCK", constants.get("BLOCK_PAIRS")))
    return "" if rows is None else f"{rows}×{columns}"


USAGE = ("usage: python -m tests.kernels.triton_targets record FILE [--all] [--float32] [--widths W,...] | "
         "compile FILE | table FILE...")


NOT_INTERPRETED = "record runs the kernels on CPU tensors under Triton's interpreter: set TRITON_INTERPRET=1"


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def widths_argument(arguments: list[str]) -> tuple[tuple[int, ...] | None, list[str]]:
    """(the head widths of ``--widths W,...``, () without it, None after printing one line for a bad value; the
    other arguments)."""
    if "--widths" not in arguments:
        return (), arguments
    at = arguments.index("--widths")
    value = arguments[at + 1] if at + 1 < len(arguments) else ""
    widths = tuple(int(w) for w in value.split(",") if w.isdigit())
    if not widths or len(widths) != len(value.split(",")) or not all(1 <= w <= 256 for w in widths):
        print(f"--widths must be head widths from 1 to 256, separated by commas, got {value!r}", file=sys.stderr)
        return None, arguments
    return widths, arguments[:at] + arguments[at + 2:]


def main(arguments: list[str]) -> int:
    """The command line: 0 when it did its work, 1 when a launch failed to compile or did not fit, 2 (one line on
    stderr) for a wrong command or a launches file that is missing or not one ``record`` wrote."""
    if len(arguments) < 2 or arguments[0] not in ("record", "compile", "table"):
        print(USAGE, file=sys.stderr)
        return 2
    widths, arguments = widths_argument(arguments)
    if widths is None:
        return 2
    command, paths = arguments[0], [a for a in arguments[1:] if not a.startswith("--")]
    if not paths:
        print(USAGE, file=sys.stderr)
        return 2
    if command == "record" and not interpreted():
        print(NOT_INTERPRETED, file=sys.stderr)
        return 2
    if command == "record":
        record(paths[0], everything="--all" in arguments, float32="--float32" in arguments, widths=widths)
        return 0
    for path in paths:
        try:
            launches = json.loads(Path(path).read_text())
            if not isinstance(launches, list) or not all(isinstance(x, dict) and "divisible" in x for x in launches):
                raise ValueError("not a list of launches")
        except (OSError, ValueError) as error:
            print(f"{path}: not a launches file written by `record` ({error})", file=sys.stderr)
            return 2
    if command == "table":
        text, all_fine = table(paths)
        print(text)
        return 0 if all_fine else 1
    print(json.dumps(compile_all(paths[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
