"""Command line: ``posenc <command>`` (also ``python -m posenc``). Thin: parse, validate, call."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _add_extrapolate(commands) -> None:
    from .experiments.extrapolate import PRESETS
    from .experiments.rows import DEFAULT_ROWS, ROWS

    p = commands.add_parser(
        "extrapolate", help="train tiny LMs at one length, report bits-per-byte at 1x..8x",
        description="Train a tiny byte-level LM per encoding at --train-length and evaluate bits-per-byte at "
                    "multiples of it (the main job). Defaults: the embedded Python-stdlib corpus, preset 'default'.",
    )
    p.add_argument("--preset", default="default", choices=sorted(PRESETS), help="model/training size (default: default)")
    p.add_argument("--encodings", default="default",
                   help=f"'all', 'default' ({', '.join(DEFAULT_ROWS)}) or a comma list of: {', '.join(ROWS)}")
    p.add_argument("--text", help="a text file or folder to use instead of the embedded stdlib corpus")
    p.add_argument("--out", type=Path, help="run directory (default: runs/<timestamp>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished work")
    p.add_argument("--train-length", type=int, help="training window length in bytes")
    p.add_argument("--eval-factors", type=_ints, help="eval lengths as multiples of the train length (default 1,2,4,8)")
    p.add_argument("--eval-stride", type=int, help="sliding-window evaluation with this stride (default: non-overlapping)")
    p.add_argument("--eval-windows", type=int, help="number of longest-length windows in the eval span")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--batch-size", type=int, help="global batch size (split across DDP processes)")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--dim", type=int, help="model width")
    p.add_argument("--layers", dest="num_layers", type=int, help="transformer blocks")
    p.add_argument("--heads", dest="num_heads", type=int, help="attention heads")
    p.add_argument("--seeds", type=int, help="repeat with this many seeds and report mean ± std (default 1)")
    p.add_argument("--seed", type=int, help="first seed (default 0)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="auto: CUDA (bf16 autocast) when present")
    p.set_defaults(run=_run_extrapolate)


def _run_extrapolate(args) -> int:
    from .experiments.extrapolate import ExperimentConfig, run

    overrides = {k: getattr(args, k) for k in (
        "encodings", "train_length", "eval_factors", "eval_stride", "eval_windows", "steps", "batch_size", "lr",
        "dim", "num_layers", "num_heads", "seeds", "seed", "device", "text")}
    config = ExperimentConfig.from_preset(args.preset, **overrides)
    if args.resume and args.out is None:
        raise ValueError("--resume needs --out: the run directory to continue")
    out = args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    run(config, out, resume=args.resume)
    return 0


_DTYPES = ("float32", "bfloat16", "float64")


def _add_device_dtype_json(p) -> None:
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    p.add_argument("--json", type=Path, help="also write every row to this JSON file")


def _require_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")


def _add_verify(commands) -> None:
    p = commands.add_parser("verify", help="check the seeds' claims on this device and dtype",
                            description="Run every correctness check for every encoding it applies to; "
                                        "exit code 1 if any fails.")
    _add_device_dtype_json(p)
    p.set_defaults(run=_run_verify)


def _run_verify(args) -> int:
    import torch

    from . import storage
    from .verify import format_table, run_checks, tolerance_rule

    _require_device(args.device)
    started = time.perf_counter()
    rows = run_checks(args.device, getattr(torch, args.dtype))
    print(format_table(rows))
    failed = [r for r in rows if not r.passed]
    print(f"\n{len(rows) - len(failed)} passed, {len(failed)} failed "
          f"({args.device}, {args.dtype}, {time.perf_counter() - started:.1f}s). {tolerance_rule()}")
    if args.json:
        storage.write_json(args.json, {"device": args.device, "dtype": args.dtype, "rows": [r.to_dict() for r in rows]})
    return 1 if failed else 0


def _add_plot(commands) -> None:
    p = commands.add_parser("plot", help="write the seeds' figures as PNGs",
                            description="Write PNG figures of every encoding; with --ckpt also figures of a trained "
                                        "run (learned table, T5 biases, attention maps).")
    p.add_argument("--out", type=Path, default=Path("figures"), help="folder for the PNGs (default: figures)")
    p.add_argument("--ckpt", type=Path, help="a posenc extrapolate run directory")
    p.set_defaults(run=_run_plot)


def _run_plot(args) -> int:
    from .plot_command import write_figures

    for path in write_figures(args.out, args.ckpt):
        print(path)
    return 0


def _add_bench(commands) -> None:
    p = commands.add_parser("bench", help="attention speed per encoding and backend, as ratios to eager",
                            description="Time attention() for every encoding and backend that serves it; report "
                                        "milliseconds and the ratio to eager measured in the same run.")
    _add_device_dtype_json(p)
    p.add_argument("--lengths", type=_ints, default=(256, 1024), help="sequence lengths (default 256,1024)")
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(run=_run_bench)


def _run_bench(args) -> int:
    import platform

    import torch

    from . import storage
    from .bench import bench_attention, format_rows

    _require_device(args.device)
    rows = bench_attention(args.device, getattr(torch, args.dtype), args.lengths, repeats=args.repeats)
    print(format_rows(rows))
    if args.json:
        storage.write_json(args.json, {"device": args.device, "dtype": args.dtype, "torch": torch.__version__,
                                       "machine": platform.machine(), "rows": rows})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Positional encodings for transformers.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_extrapolate(commands)
    _add_verify(commands)
    _add_plot(commands)
    _add_bench(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ValueError as error:
        print(f"posenc {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nposenc {args.command}: interrupted; finished work is saved, continue with --resume --out DIR",
              file=sys.stderr)
        return 130
