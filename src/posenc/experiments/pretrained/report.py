"""Results of ``extend --hf`` as tables, loss_by_position.png, passkey.png and rope_parameters.json."""

from __future__ import annotations

import json
from pathlib import Path

from ... import storage
from ..tables import markdown_table, stage_rows, text_table


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    lengths = results["config"]["lengths"]
    header = ["method"] + [f"{n:,}" for n in lengths]
    body = [[method] + [f"{r['loss'][str(n)]['mean']:.3f}" for n in lengths] for method, r in results["methods"].items()]
    return header, body


def passkey_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    config = results["config"]
    header = ["method"] + [f"{n:,} @ {d:g}" for n in config["passkey_lengths"] for d in config["passkey_depths"]]
    body = [[method] + [f"{r['passkey'][str(n)]['accuracy'][str(d)]:.0%}" for n in config["passkey_lengths"]
                        for d in config["passkey_depths"]] for method, r in results["methods"].items()]
    return header, body


def title(results: dict) -> str:
    return (f"{results['config']['model']} ({results['model_type']}, context {results['original_context']:,}): mean "
            f"loss (nats) over the first N tokens, factor {results['factor']:g}")


def terminal_table(results: dict) -> str:
    return "\n\n".join([title(results), text_table(*table_rows(results)), text_table(*passkey_rows(results))])


def markdown(results: dict) -> str:
    lines = [f"# {title(results)}", ""] + markdown_table(*table_rows(results))
    lines += ["", "## Passkey retrieval (accuracy per length @ depth)", ""] + markdown_table(*passkey_rows(results))
    if results["best_method"]:
        lines += ["", f"Best method at {results['best_at']:,} tokens: **{results['best_method']}**; its "
                  "`rope_parameters` (rope_parameters.json):", "", "```json",
                  json.dumps(results["best_rope_parameters"], indent=2), "```"]
    lines += ["", "## Wall time per stage", ""] + markdown_table(["stage", "seconds"], stage_rows(results["stages_s"]))
    lines += ["", f"Peak memory (RSS) {results['peak_rss_gib']:.2f} GiB. Text: {results['text_tokens']:,} tokens. "
              f"posenc {results['versions']['posenc']}, torch {results['versions']['torch']}."]
    return "\n".join(lines) + "\n"


def write_all(results: dict, out: Path) -> None:
    # matplotlib is imported only when a report is written
    from ...figures.pretrained import loss_figure, passkey_figure
    from ...figures.style import save_figure

    storage.write_json(out / "results.json", results)
    storage.write_text(out / "results.md", markdown(results))
    save_figure(loss_figure(results), out / "loss_by_position.png")
    save_figure(passkey_figure(results), out / "passkey.png")
    if results["best_method"]:
        storage.write_json(out / "rope_parameters.json", {
            "rope_parameters": results["best_rope_parameters"],
            "metadata": {"method": results["best_method"], "chosen_by": f"lowest mean loss over the first "
                         f"{results['best_at']} tokens", "model": results["config"]["model"]}})
