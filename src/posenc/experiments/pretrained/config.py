"""What ``posenc pretrained`` runs: its presets and its config, checked on construction.

Rows are the zero-shot ``methods`` (scalings, ``self-extend``, ``rerope``, ``string`` and ``dca``) plus, with ``finetune``, the
``finetune_method`` scaling fine-tuned (``pose``: PoSE, and its control with plain ids; ``full``: full-length).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ... import checks
from ...extension.adapt import MODES, check_lora_rank
from ...extension.methods import BY_NAME, METHODS, parse_methods
from ...extension.retrieval import LABELS, check_format
from ...extension.retrieval_tasks import check_tasks, labels_needed
from ...lm.corpora import parse_corpora
from ..presets import preset_values
from . import swaps

SCALING_METHODS = ("none", *METHODS)  # none: the model as it was trained
ATTENTION_METHODS = tuple(swaps.BY_NAME)  # the model's attention swapped (``swaps``)
HF_METHODS = SCALING_METHODS + ATTENTION_METHODS
DRAWS = ("longest", "seeded")
FINETUNE = ("none",) + tuple(m for m in MODES if m != "control")  # the control comes with pose

HF_PRESETS: dict[str, dict] = {
    # A tiny random Llama built offline, byte tokens: seconds. Its answers are noise; it tests the plumbing.
    "smoke": dict(model="tiny", to=1024, methods=("none", "yarn", "ntk", "self-extend"), corpus="stdlib",
                  documents=4, dev_documents=2, bands=4, keys_per_band=1, bins=8, chunk=256, first_tokens=32,
                  control_stride=128, finetune="pose", finetune_window=48, finetune_steps=6, finetune_lr=1e-3,
                  curve_points=3, self_extend_window=32),
    # SmolLM2-135M on the 2-core CPU, a first look that can answer: the unscaled model and YaRN at 1.5x its 8k
    # context on 8 documents, the fewest with which its family of 4 can pass Holm's level (verdicts.units_needed),
    # with the default's control (6,145-8,192 tokens), one key per band, the far keys and context use: 52 min on
    # a 2-core EPYC whose cores other work shared (7 documents without them: 23 min alone), two verdicts (the
    # unscaled model's collapse, YaRN's keys). 1.25x took 16 min, but there the unscaled model loses hundredths.
    "quick": dict(model="smollm2", to=12288, methods=("none", "yarn"), corpus="kjv,stdlib",
                  documents=8, dev_documents=2, bands=4, keys_per_band=1, bins=24, chunk=2048, first_tokens=2048,
                  control_stride=2048, finetune="none", self_extend_window=4096),
    # SmolLM2-135M at 1.5x its context on 16 test documents of the Bible and the stdlib (4 dev): every row the
    # real-evidence protocol asks for, PoSE with its control: PretrainedConfig's own defaults, fine-tuned.
    "default": dict(finetune="pose"),
    # A GPU: 2x the context, every zero-shot row, PoSE over 4,096-token windows, the same control as at 1.5x (its
    # 2x run of 2026-11-26 re-read every 1,024 tokens, a control of its own). 2x, not 4x: the Bible's dev split
    # has one book of 32,768 tokens (Psalms), too few to choose a row on; 4x is --to 32768 --corpus kjv
    # --documents 8 --dev-documents 1, a look whose choice rests on one document.
    "gpu": dict(model="smollm2", to=16384, methods=("none", "yarn", "ntk", "dynamic", "self-extend", "string"),
                corpus="kjv,stdlib", documents=16, dev_documents=4, bands=4, keys_per_band=2, bins=32, chunk=4096,
                first_tokens=2048, control_stride=2048, finetune="pose", finetune_window=4096, finetune_steps=200,
                finetune_lr=2e-5, curve_points=5, self_extend_window=4096),
}


@dataclass(frozen=True)
class PretrainedConfig:
    preset: str = "default"
    model: str = "smollm2"  # a path, "smollm2", or "tiny" (the smoke model)
    to: int = 12288
    methods: tuple[str, ...] = ("none", "yarn", "self-extend")
    corpus: str = "kjv,stdlib"  # named corpora (lm.corpora), unless --text
    documents: int = 16  # test documents: the first --to tokens of each, with keys planted for retrieval
    draw: str = "longest"  # which long documents: longest first per source, or seeded (measure.long_documents)
    dev_documents: int = 4  # dev documents: choose the exported row
    bands: int = 4  # depth bands the planted keys are spread over
    keys_per_band: int = 2
    retrieval_format: str = "auto"  # a key of retrieval.FORMATS, or auto: what the unscaled model answers best on dev
    retrieval_tasks: tuple[str, ...] = ()  # RULER tasks asked beside the keys: multi-value, variable-tracking
    task_questions: int = 2  # questions of each task per document
    task_size: int = 2  # values per multi-value question, links per variable-tracking chain
    control_stride: int = 2048  # the context control re-reads every this many tokens
    bins: int = 24
    chunk: int = 2048
    first_tokens: int = 2048  # the cost inside the context: mean loss over these first tokens
    finetune: str = "none"  # none | pose (adds the control row) | full
    finetune_method: str = "yarn"
    finetune_window: int = 1024
    finetune_steps: int = 24
    finetune_lr: float = 5e-5
    finetune_batch: int = 1
    pose_chunks: int = 2
    lora: int = 0
    curve_points: int = 2
    self_extend_window: int = 4096
    self_extend_group: int | None = None  # None: the smallest that keeps distances inside the context
    string_shift: int | None = None  # None: the smallest that keeps distances inside the context (>= a third of it)
    string_local: int = 128  # STRING's local window (the paper's default)
    search_population: int = 8
    search_generations: int = 4
    text: str | None = None
    seed: int = 0

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "PretrainedConfig":
        values = preset_values(HF_PRESETS, preset, overrides)
        if isinstance(values.get("methods"), str):
            values["methods"] = parse_methods(values["methods"], HF_METHODS)
        if isinstance(values.get("retrieval_tasks"), str):
            values["retrieval_tasks"] = tuple(t for t in values["retrieval_tasks"].split(",") if t)
        return cls(preset=preset, **values)

    def __post_init__(self):
        checks.positive_int("--to", self.to, minimum=2)
        parse_methods(self.methods, HF_METHODS)
        checks.choice("--finetune", self.finetune, FINETUNE)
        checks.choice("--finetune-method", self.finetune_method, [m for m in METHODS if BY_NAME[m].fine_tunable])
        if self.text is None:
            parse_corpora(self.corpus)
        checks.positive_int("--documents", self.documents, minimum=2)  # a paired t interval needs two
        checks.choice("--draw", self.draw, DRAWS)
        checks.positive_int("--dev-documents", self.dev_documents)
        if self.bands * self.keys_per_band > len(LABELS):
            raise ValueError(f"--keys-per-band ({self.keys_per_band}) x {self.bands} bands is over the "
                             f"{len(LABELS)} labels a document can hold")
        if self.retrieval_format != "auto":
            check_format(self.retrieval_format)
        check_tasks(self.task_counts, self.task_size)
        if len(set(self.retrieval_tasks)) < len(self.retrieval_tasks):
            raise ValueError(f"--retrieval-tasks names a task twice: {','.join(self.retrieval_tasks)}")
        needed = self.bands * self.keys_per_band + labels_needed(self.task_counts, self.task_size)
        if needed > len(LABELS):
            raise ValueError(f"the keys ({self.bands} bands x --keys-per-band {self.keys_per_band}) and the tasks' "
                             f"questions need {needed} labels, over the {len(LABELS)} a document can hold")
        for name in ("bands", "keys_per_band", "control_stride", "bins", "chunk", "first_tokens",
                     "finetune_steps", "finetune_batch", "pose_chunks", "curve_points", "self_extend_window"):
            checks.positive_int("--" + name.replace("_", "-"), getattr(self, name))
        checks.positive_int("--finetune-window", self.finetune_window, minimum=2)  # a token and the next it predicts
        checks.positive_float("--finetune-lr", self.finetune_lr)
        if self.lora != 0:
            check_lora_rank(self.lora)
        if self.self_extend_group is not None:
            checks.positive_int("--self-extend-group", self.self_extend_group, minimum=2)
        if self.uses_self_extend and self.self_extend_window >= self.to:
            raise ValueError(f"--self-extend-window ({self.self_extend_window}) must be below --to ({self.to})")
        if self.string_shift is not None:
            checks.positive_int("--string-shift", self.string_shift)
        checks.positive_int("--string-local", self.string_local, minimum=0)
        if "string" in self.methods and self.string_shift is not None and self.string_local >= self.string_shift:
            raise ValueError(f"--string-local ({self.string_local}) must be below --string-shift ({self.string_shift})")
        checks.positive_int("--search-population", self.search_population, minimum=4)
        checks.positive_int("--search-generations", self.search_generations)

    @property
    def task_counts(self) -> dict[str, int]:
        """{task of --retrieval-tasks: questions per document}, as ``retrieval.make_haystack`` takes them."""
        return {task: self.task_questions for task in self.retrieval_tasks}

    @property
    def uses_self_extend(self) -> bool:
        """A row reads through Self-Extend's window (Self-Extend, ReRoPE)."""
        return any(swaps.BY_NAME[m].windowed for m in self.methods if m in swaps.BY_NAME)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan_rows(config: PretrainedConfig) -> dict[str, dict]:
    """{row name: {"method": scaling method, "attention": "sdpa" or one of ``ATTENTION_METHODS``,
    "finetune": mode}}."""
    rows = {}
    for method in config.methods:
        extend = method in ATTENTION_METHODS
        rows[method] = {"method": "none" if extend else method, "attention": method if extend else "sdpa",
                        "finetune": None}
    modes = {"none": (), "pose": ("pose", "control"), "full": ("full",)}[config.finetune]
    for mode in modes:
        rows[f"{config.finetune_method}+{mode}"] = {"method": config.finetune_method, "attention": "sdpa",
                                                    "finetune": mode}
    return rows
