"""``posenc bench``: its flags and its run (``cli`` adds the device, dtype and json flags it shares with verify)."""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

from .. import storage
from ..attention import BACKENDS
from ..checks import choice, each_once, positive_int
from ..encodings.registry import baseline, one_axis
from . import attention, long_context
from .attention import bench_attention
from .forms import bench_score_forms
from .long_context import bench_long_context
from .machine import describe, one_line
from .report import TABLES, markdown, plain
from .rope_apply import bench_rope_apply
from .training import bench_activation_memory, bench_training_step

DESCRIPTION = ("Time attention() per encoding and backend (ratio to eager), a training step per encoding (ratio to "
               "NoPE), RoPE apply (ratio to copy_ of the same bytes), score terms as a bias vs as q/k channels (ratio "
               "to NoPE), count activation memory (ratio to NoPE) and, on a GPU, time long-context attention forward "
               "and backward per encoding, each in its own process (ratio to SDPA without positions). Every table "
               "names the CPU, its cores and the torch version. Timings are round-robin.")


def every_encoding() -> tuple[str, ...]:
    """Every encoding a table times (the training table's: every one the tiny LM trains), read when called."""
    return tuple(dict.fromkeys(one_axis() + attention.timed_encodings() + long_context.timed_encodings()))


def _positive_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def _shape_list(text: str, names: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """'64x32,512x8' -> ((64, 32), (512, 8)): one positive integer per name in each shape."""
    try:
        shapes = tuple(tuple(int(n) for n in part.split("x")) for part in text.split(",") if part.strip())
    except ValueError:
        shapes = ()
    if not shapes or any(len(s) != len(names) or min(s) < 1 for s in shapes):
        pattern = "x".join(names)
        raise argparse.ArgumentTypeError(f"expected {pattern}[,{pattern}...] with positive integers, got {text!r}")
    return shapes


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    """Training length x batch size."""
    return _shape_list(text, ("LENGTH", "BATCH"))


def _long_shapes(text: str) -> tuple[tuple[int, int, int, int], ...]:
    return _shape_list(text, ("B", "H", "T", "Dh"))


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tables", default="attention,training,rope,forms,memory",
                   help=f"comma list of: {', '.join(TABLES)} (default: all but long, which is for --device cuda)")
    p.add_argument("--encodings", default="all",
                   help=f"'all' or a comma list of: {', '.join(every_encoding())}; the attention, training, memory and long "
                        "tables time only these (NoPE always runs, as the baseline)")
    p.add_argument("--lengths", type=_positive_ints, default=(256, 1024), help="attention lengths (default 256,1024)")
    p.add_argument("--train-shapes", type=_shapes, default=((64, 32), (512, 8)),
                   help="training LENGTHxBATCH list (default 64x32,512x8)")
    p.add_argument("--rope-shape", type=_positive_ints, default=(4, 16, 2048, 64), help="B,H,T,Dh (default 4,16,2048,64)")
    p.add_argument("--rounds", type=int, default=7,
                   help="round-robin rounds per table; the long table: timed calls per row (default 7)")
    p.add_argument("--compile", action="store_true", help="also time the training step under torch.compile")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="attention backend of the training and memory tables' models (NoPE, the baseline, stays on "
                        "auto; default auto)")
    p.add_argument("--long-shapes", type=_long_shapes, default=long_context.SHAPES,
                   help="the long table's BxHxTxDh list (default 1x16x16384x64,4x16x4096x64)")
    p.add_argument("--long-timeout", type=_seconds, default=120.0,
                   help="seconds a long-table row may take, warm-up and compiles included, before it is an error row "
                        "(default 120)")
    p.add_argument("--long-json", type=Path,
                   help="also write the long table's rows, a JSON list, to this file (rows of shapes this run does "
                        "not time are kept), after every row")
    p.add_argument("--markdown", type=Path, help="also write the tables as Markdown to this file")


def chosen_encodings(text: str) -> tuple[str, ...]:
    """--encodings as names in the tables' order, NoPE (the baseline) always among them."""
    every = every_encoding()
    if text == "all":
        return every
    given = [choice("--encodings", name.strip(), list(every)) for name in text.split(",") if name.strip()]
    each_once("--encodings", given)
    names = set(given)
    if not names:
        raise ValueError(f"--encodings names no encoding: pass 'all' or a comma list of {', '.join(every)}")
    return tuple(name for name in every if name in names | {baseline()})


def run(args) -> int:
    tables = [choice("--tables", name.strip(), list(TABLES)) for name in args.tables.split(",") if name.strip()]
    if not tables:
        raise ValueError(f"--tables names no table: pass a comma list of {', '.join(TABLES)}")
    each_once("--tables", tables)
    positive_int("--rounds", args.rounds, minimum=2)
    if len(args.rope_shape) != 4 or args.rope_shape[-1] % 2:
        raise ValueError(f"--rope-shape must be B,H,T,Dh with an even Dh, got {args.rope_shape}")
    if args.compile and "training" not in tables:
        raise ValueError("--compile times the training table: add training to --tables")
    if args.long_json and "long" not in tables:
        raise ValueError("--long-json writes the long table: add long to --tables")
    if args.long_json:
        _merged_long_rows(args.long_json, [], args.long_shapes)  # a file of something else fails before any work
    for flag, path in (("--json", args.json), ("--markdown", args.markdown), ("--long-json", args.long_json)):
        storage.writable(flag, path)
    encodings = chosen_encodings(args.encodings)
    timed, trained, attended = (tuple(n for n in encodings if n in names)
                                for names in (attention.timed_encodings(), one_axis(), long_context.timed_encodings()))
    dtype = getattr(torch, args.dtype)
    # the models train in float32, or under autocast to a 16-bit --dtype (as extrapolate trains on a GPU)
    step = {"backend": args.backend, "autocast": None if dtype in (torch.float32, torch.float64) else dtype}
    meta = {**describe(args.device), "dtype": args.dtype, "machine": platform.machine()}
    results = {}

    def keep_long(rows: list[dict]) -> None:  # after every row: a long table cut short keeps the rows it measured
        results["long"] = rows
        _write_files(args, meta, results)

    run_table = {
        "attention": lambda: bench_attention(args.device, dtype, args.lengths, rounds=args.rounds, encodings=timed),
        "training": lambda: bench_training_step(args.device, args.train_shapes, trained, rounds=args.rounds, **step)
        + (bench_training_step(args.device, args.train_shapes, trained, rounds=args.rounds, compile=True, **step)
           if args.compile else []),
        "rope": lambda: bench_rope_apply(args.device, dtype, args.rope_shape, rounds=args.rounds),
        "forms": lambda: bench_score_forms(args.device, rounds=args.rounds),
        "memory": lambda: bench_activation_memory(args.device, args.train_shapes, trained, **step),
        "long": lambda: bench_long_context(args.device, args.dtype, args.long_shapes, attended, calls=args.rounds,
                                           timeout=args.long_timeout, on_row=keep_long),
    }
    for name in tables:
        results[name] = run_table[name]()
        print(plain(name, results[name], one_line(meta)) + "\n", flush=True)
        _write_files(args, meta, results)  # after every table: an interrupted bench keeps what it measured
    return 0


def _write_files(args, meta: dict, results: dict) -> None:
    if args.json:
        storage.write_json(args.json, {**meta, "tables": results})
    if args.long_json and "long" in results:
        storage.write_json(args.long_json, _merged_long_rows(args.long_json, results["long"], args.long_shapes))
    if args.markdown:
        machine = one_line(meta)
        text = f"Measured on {machine}, {args.dtype}.\n\n"
        storage.write_text(args.markdown, text + "\n".join(markdown(n, rows, machine) for n, rows in results.items()))


def _merged_long_rows(path: Path, rows: list[dict], shapes) -> list[dict]:
    """``rows`` after the rows already in ``path`` of shapes other than this run's ``shapes``: a GPU call too short
    for every shape can time one shape per call into the same file."""
    kept = storage.read_json(path) if path.exists() else []
    shaped = isinstance(kept, list) and all(isinstance(row, dict) and {"B", "H", "T", "Dh"} <= set(row) for row in kept)
    if not shaped:
        raise ValueError(f"--long-json {path} holds something other than long-table rows; name another file")
    timed = {tuple(shape) for shape in shapes}
    return [row for row in kept if (row["B"], row["H"], row["T"], row["Dh"]) not in timed] + rows
