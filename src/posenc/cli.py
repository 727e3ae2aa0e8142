"""Command line: ``posenc <command>`` (also ``python -m posenc``). Thin: parse, validate, call."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .experiments.arguments import run_folder


def _add_experiment(commands, name: str, command, run, help: str, description: str) -> None:
    """A command whose parser is its ``command`` module's (``experiments/<name>/command.py``)."""
    p = commands.add_parser(name, help=help, description=description)
    command.add_arguments(p)
    p.set_defaults(run=run)


def _add_experiments(commands) -> None:
    from .experiments.extend import command as extend
    from .experiments.extrapolate import command as extrapolate
    from .experiments.pretrained import command as pretrained
    from .experiments.tasks import command as task

    _add_experiment(commands, "extrapolate", extrapolate, _run_extrapolate,
                    "train tiny LMs at one length, report bits-per-byte at 1x..8x",
                    "Train a tiny byte-level LM per encoding at --train-length and evaluate bits-per-byte at "
                    "multiples of it (the main job). Defaults: the embedded Python-stdlib corpus, preset 'default'.")
    _add_experiment(commands, "task", task, _run_task,
                    "train tiny models on a synthetic task at one length, report exact match at 1x..8x",
                    "Train a tiny model per row on copy or recall at --train-length and score exact match at "
                    "multiples of it, where length generalisation is pass or fail (formerly posenc extrapolate "
                    "--task).")
    _add_experiment(commands, "extend", extend, _run_extend,
                    "stretch a trained RoPE model to N× its length: zero-shot, fine-tuned, LongRoPE-searched",
                    "Extend a RoPE model trained by posenc extrapolate (trained here when no --run is given) to "
                    "--factor × its training length with each method, zero-shot and after a brief fine-tune at the "
                    "target length, with ALiBi fine-tuned on the same extra tokens as the baseline; search "
                    "LongRoPE factors and export them as rope_parameters.json. A pretrained Hugging Face model: "
                    "posenc pretrained.")
    _add_experiment(commands, "pretrained", pretrained, _run_pretrained,
                    "a pretrained Hugging Face RoPE model past its context: measure, adapt, export",
                    "Load a pretrained RoPE model, run it at --to tokens with each scaling and attention swap "
                    "(zero-shot, and fine-tuned with --finetune), measure loss by position, context use and "
                    "retrieval on long documents against the unscaled model re-reading, and export the row dev "
                    "chooses (formerly posenc extend --hf).")


def _run_extrapolate(args) -> int:
    from .experiments.extrapolate import command, run

    run(command.config_of(args), run_folder(args), resume=args.resume)
    return 0


def _run_task(args) -> int:
    from .experiments.tasks import command, run

    run(command.config_of(args), run_folder(args), resume=args.resume)
    return 0


def _run_extend(args) -> int:
    from .experiments.extend import command, run

    run(command.config_of(args), run_folder(args), run_dir=args.run_dir, text=args.text, device=args.device,
        resume=args.resume, only_seeds=args.only_seeds)
    return 0


def _run_pretrained(args) -> int:
    from .experiments.pretrained import command, run

    run(command.config_of(args), run_folder(args), resume=args.resume, export=args.export, device=args.device)
    return 0


def _old_spelling(argv: list[str]) -> list[str]:
    """The spellings from before ``pretrained`` and ``task`` were commands: ``extend --hf MODEL ...`` as
    ``pretrained MODEL ...``, ``extrapolate --task copy ...`` as ``task copy ...`` (``--task lm``: dropped)."""
    old = {"extend": ("--hf", "pretrained"), "extrapolate": ("--task", "task")}.get(argv[0] if argv else "")
    taken = old and _take_flag(argv[1:], old[0])
    if not taken:
        return argv
    value, rest = taken
    if old[0] == "--task" and value == "lm":
        return ["extrapolate", *rest]
    named = "MODEL" if old[0] == "--hf" else value
    print(f"posenc: '{argv[0]} {old[0]}' is now 'posenc {old[1]} {named}'; running that", file=sys.stderr)
    return [old[1], value, *rest]


def _take_flag(args: list[str], flag: str) -> tuple[str, list[str]] | None:
    """(the value of ``flag`` — ``FLAG VALUE`` or ``FLAG=VALUE`` —, the other arguments), or None without it."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1], args[:i] + args[i + 2:]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1], args[:i] + args[i + 1:]
    return None


_DTYPES = ("float32", "bfloat16", "float64")


def _add_device_dtype_json(p) -> None:
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run (default: cpu)")
    p.add_argument("--dtype", default="float32", choices=sorted(_DTYPES),
                   help="the dtype the checks or timed calls run in (default: float32)")
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
    storage.writable("--json", args.json)
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
    from . import storage
    from .experiments.extrapolate import attention_window, trained_models
    from .figures.plot import write_figures

    models, window = (trained_models(args.ckpt), attention_window(args.ckpt)) if args.ckpt else (None, None)
    storage.output_folder("--out", args.out)
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
    p = commands.add_parser("report", help="regenerate the README's, docs' and benchmarks' tables from their results "
                                           "files",
                            description="Rewrite every table marked '<!-- generated by `posenc report`: TABLE "
                                        "RESULTS.json -->' in the given Markdown files (default: README.md, "
                                        "docs/**/*.md and benchmarks/*/README.md here) from its results file.")
    p.add_argument("files", nargs="*", type=Path,
                   help="Markdown files (default: README.md, docs/**/*.md and benchmarks/*/README.md)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its file")
    p.set_defaults(run=_run_report)


def _run_report(args) -> int:
    from .bench import page
    from .experiments import published

    files = args.files or published.documented(Path.cwd()) + page.pages(Path.cwd())
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise ValueError(f"no Markdown file {', '.join(missing)}" if missing else
                         "no README.md, docs/ or benchmarks/ pages here; name the Markdown files")
    plain = [str(f) for f in args.files if not published.BEGIN.search(f.read_text())]
    if plain:  # a file named by hand that has nothing to write is a wrong name, not a success
        raise ValueError(f"{', '.join(plain)}: no generated table (a line '<!-- generated by `posenc report`: "
                         f"TABLE RESULTS.json -->')")
    changed = published.stale(files, render_region) if args.check else published.update(files, render_region)
    for path in changed:
        print(f"{path}: {'differs from its results files' if args.check else 'tables rewritten'}")
    return 1 if args.check and changed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Positional encodings for transformers.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_experiments(commands)
    _add_verify(commands)
    _add_plot(commands)
    _add_bench(commands)
    _add_report(commands)
    return parser


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def command_rows() -> tuple[list[str], list[list[str]]]:
    """(header, rows) of docs/README.md's table of commands: each command and its line in ``posenc --help``."""
    return ["command", "what it does"], [[f"`posenc {a.dest}`", a.help] for a in
                                         _commands(build_parser())._choices_actions]


def render_region(table: str, results) -> str:
    """What ``posenc report`` writes into a generated region: the table of commands (a region naming ``posenc`` as
    its source) from this parser, the machines' tables through ``bench.page``, the rest through
    ``experiments.published``."""
    from .bench import page
    from .experiments import published

    if table == "commands":
        return published.text_table(*command_rows())
    return page.renderer(published.render)(table, results)


def _unknown_flags(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit as argparse does on arguments no flag of ``command`` takes, naming the commands whose flags they are."""
    subparsers = _commands(parser)
    flags = {arg.split("=", 1)[0] for arg in unknown if arg.startswith("--")}
    owners = [name for name, sub in subparsers.choices.items() if name != command
              and flags and flags <= {o for action in sub._actions for o in action.option_strings}]
    hint = f" ({', '.join(sorted(flags))}: flags of posenc {' and posenc '.join(owners)})" if owners else ""
    subparsers.choices[command].error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(_old_spelling(sys.argv[1:] if argv is None else list(argv)))
    if unknown:
        _unknown_flags(parser, args.command, unknown)
    from .lm.runtime import provenance

    provenance()  # the commit and machine the work starts from, read before it runs (a run may outlast a commit)
    try:
        return args.run(args)
    except ValueError as error:
        print(f"posenc {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        folder = getattr(args, "folder", None)  # a run folder's commands set it (arguments.run_folder)
        how = f" in {folder}: continue with the same command and --resume --out {folder}" if folder else ""
        print(f"\nposenc {args.command}: interrupted; finished work is saved{how}", file=sys.stderr)
        return 130
