"""Verdict sentences written from results, under one rule for the real-model and the tiny-model runs.

**The rule.** A comparison a − b belongs to a *family*: the comparisons a run declares together (``extrapolate
--compare``, or the fixed set ``pretrained`` makes). It carries a verdict only where both hold:
1. its Student t interval over the units (the documents of a real-model run, the seeds of a tiny-model run) at level
   1 − α/m, m the family's size (Bonferroni), excludes zero;
2. its exact sign-flip p, Holm-corrected over the family, is below α.
The smallest sign-flip p over n units is 2/2ⁿ, so below ``units_needed(m)`` units (10 for a family of 19) part 2
cannot pass whatever the data: five seeds never carry a verdict. Such a comparison whose corrected interval
excludes zero and whose sign holds in every unit is reported as *consistent*, and never as a verdict; every other
one reads "no verdict".

A tiny-model results file holds each seed's mean per row and length (``per_seed``), so its family is computed here,
the seed as the unit (``seed_comparisons``); a real-model file carries its corrected family (``comparisons``).
"""

from __future__ import annotations

import textwrap

from .documents import ALPHA, DRAWS, EXACT_UP_TO, correct, paired

RULE = (f"A verdict needs the Bonferroni t interval over the family (level 1 − {ALPHA}/m) to exclude zero and the "
        f"exact sign-flip p, Holm-corrected over the family, to be below {ALPHA}.")
VERDICT, CONSISTENT, NONE = "verdict", "consistent", "no verdict"
WIDTH = 116  # the README's and docs' line length


def smallest_p(units: int) -> float:
    """The smallest p the sign-flip test (``documents.sign_flip_p``) can give over ``units`` differences."""
    return 2.0 / 2 ** units if units <= EXACT_UP_TO else 1.0 / (1 + DRAWS)


def units_needed(family_size: int) -> int:
    """The fewest units with which the best comparison of a family of ``family_size`` can pass Holm's level."""
    units = 2
    while family_size * smallest_p(units) >= ALPHA:
        units += 1
    return units


def outcome(comparison: dict) -> str:
    """VERDICT, CONSISTENT or NONE, for a comparison of ``documents.correct``. CONSISTENT: no verdict, yet the
    corrected interval excludes zero and every unit has the mean's sign. With every unit of one sign the sign-flip
    p is its smallest, 2/2ⁿ, so such a comparison lacks a verdict only because its units are too few for part 2."""
    if comparison["verdict"]:
        return VERDICT
    low, high = comparison["corrected"]
    same_sign = all(d * comparison["mean"] > 0 for d in comparison["per_document"].values())
    return CONSISTENT if not low <= 0 <= high and same_sign else NONE


def parse_family(text: str) -> tuple[tuple[str, str, int | None], ...]:
    """``--compare``'s "a:b@F,a:b,…" -> ((a, b, F), …): row a minus row b at F× the training length, or at every
    length (F None) where no "@F" is given."""
    family = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        pair, _, factor = part.partition("@")
        a, colon, b = pair.partition(":")
        if not colon or not a.strip() or not b.strip() or (factor and not factor.strip().isdigit()):
            raise ValueError(f"--compare: each comparison is ROW:ROW or ROW:ROW@FACTOR (e.g. alibi:sandwich@8), got "
                             f"{part!r}")
        family.append((a.strip(), b.strip(), int(factor) if factor else None))
    return tuple(family)


def expand_family(family, rows: list[str], factors: tuple[int, ...]) -> list[dict]:
    """Each comparison of ``family`` (``parse_family``) at each of its factors: [{"a", "b", "factor"}, …], checked
    against the run's ``rows`` and eval ``factors``."""
    expanded = []
    for a, b, factor in family:
        for name in (a, b):
            if name not in rows:
                raise ValueError(f"--compare: {name!r} is not a row of this run; its rows: {', '.join(rows)}")
        if a == b:
            raise ValueError(f"--compare: {a}:{b} compares a row with itself")
        if factor is not None and factor not in factors:
            raise ValueError(f"--compare: {a}:{b}@{factor}: {factor} is not one of --eval-factors {factors}")
        expanded += [{"a": a, "b": b, "factor": f} for f in ([factor] if factor else sorted(set(factors)))]
    if len({(c["a"], c["b"], c["factor"]) for c in expanded}) != len(expanded):
        raise ValueError("--compare: a comparison is named twice")
    return expanded


def seed_comparisons(results: dict) -> dict[str, dict]:
    """A tiny-model run's declared family (``results["family"]``), paired over seeds and corrected together:
    {"bits at F× (L): a − b": ``documents.correct``'s comparison}, per_document keyed "seed k". A comparison where a
    row has no value (a learned table past its length) is left out (``without_values``)."""
    rows = {row["name"]: row for row in results["rows"]}
    first, train_length = results["config"]["seed"], results["train_length"]
    family = {}
    for c in results["family"]["comparisons"]:
        length = str(c["factor"] * train_length)
        a, b = ([seed[length] for seed in rows[name]["per_seed"]] for name in (c["a"], c["b"]))
        if None not in a and None not in b:
            seeds = [f"seed {s}" for s in range(first, first + len(a))]
            family[f"bits at {c['factor']}× ({length}): {c['a']} − {c['b']}"] = paired(a, b, seeds)
    return correct(family)


def without_values(results: dict) -> list[str]:
    """The declared comparisons a row of which has no value at their length, as "a − b at F×"."""
    rows = {row["name"]: row for row in results["rows"]}
    length = lambda c: str(c["factor"] * results["train_length"])  # noqa: E731
    return [f"{c['a']} − {c['b']} at {c['factor']}×" for c in results["family"]["comparisons"]
            if any(seed[length(c)] is None for name in (c["a"], c["b"]) for seed in rows[name]["per_seed"])]


def _numbers(c: dict) -> str:
    return (f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}], corrected [{c['corrected'][0]:+.3f}, {c['corrected'][1]:+.3f}], "
            f"Holm p {c['p_holm']:#.2g}")


def direction(name: str, mean: float) -> str:
    """What the sign of a − b means for the measure ``name`` names: lower loss or bits is better, more found is."""
    what, rows = name.split(": ", 1)
    a, b = rows.split(" − ")
    if what.startswith(("loss", "bits")):
        return f"{a} {'lower' if mean < 0 else 'higher'} than {b}"
    found = what if what.endswith("keys") else "keys" if what.startswith("keys") else what.split(" found")[0] + " answers"
    return f"{a} finds {'more' if mean > 0 else 'fewer'} {found} than {b}"


def sentences(comparisons: dict[str, dict], unit: str, compact: bool = False) -> list[str]:
    """Markdown lines: the rule, then one bullet per comparison of the family, verdicts first, each with its raw
    mean and interval, its corrected interval and Holm's p; ``unit`` names what a comparison is paired over
    ("document", "seed"). ``compact`` (the README's): a heading per kind, the mean and corrected interval only, and
    the comparisons without a verdict in one paragraph."""
    if not comparisons:
        return []
    m, n = len(comparisons), len(next(iter(comparisons.values()))["per_document"])
    reach = ("" if m * smallest_p(n) < ALPHA else
             f" With {n} {unit}s no comparison can pass part 2 (its p is at least {smallest_p(n):.2g}, times "
             f"{m} after Holm): a family of {m} needs {units_needed(m)} {unit}s.")
    lines = [f"Family of {m} comparisons over {n} {unit}s. {RULE}{reach}", ""]
    kinds = {name: outcome(c) for name, c in comparisons.items()}
    if compact:
        return lines + _compact(comparisons, kinds, unit)
    for kind in (VERDICT, CONSISTENT, NONE):
        for name, c in comparisons.items():
            measure, pair = name.split(": ", 1)
            if kinds[name] == kind == VERDICT:
                lines.append(f"- **{direction(name, c['mean'])}** ({measure}: {_numbers(c)}).")
            elif kinds[name] == kind == CONSISTENT:
                lines.append(f"- Consistent, not a verdict: {direction(name, c['mean'])} in every {unit} ({measure}: "
                             f"{_numbers(c)}).")
            elif kinds[name] == kind == NONE:
                lines.append(f"- No verdict: {pair}, {measure}: {_numbers(c)}.")
    return lines


def _compact(comparisons: dict[str, dict], kinds: dict[str, str], unit: str) -> list[str]:
    def corrected(c: dict) -> str:
        return f"{c['mean']:+.3f}, corrected [{c['corrected'][0]:+.3f}, {c['corrected'][1]:+.3f}]"

    lines = []
    verdicts = [(n, c) for n, c in comparisons.items() if kinds[n] == VERDICT]
    if verdicts:
        lines += ["Verdicts:", ""] + [f"- **{direction(n, c['mean'])}**, {n.split(': ')[0]}: {corrected(c)}, Holm p "
                                      f"{c['p_holm']:#.2g}." for n, c in verdicts] + [""]
    consistent = [(n, c) for n, c in comparisons.items() if kinds[n] == CONSISTENT]
    if consistent:
        lines += [f"Consistent in every {unit}, and not verdicts:", ""] + [
            f"- {direction(n, c['mean'])}, {n.split(': ')[0]}: {corrected(c)}." for n, c in consistent] + [""]
    without = [f"{n.split(': ', 1)[1]}, {n.split(': ')[0]} {corrected(c)}" for n, c in comparisons.items()
               if kinds[n] == NONE]
    if without:
        lines += [f"No verdict: {'; '.join(without)}.", ""]
    return lines[:-1]


HEADLINE_NAMES = 3  # past this many, a headline counts the comparisons of a kind instead of naming them


def headline(comparisons: dict[str, dict], unit: str, *after: str) -> list[str]:
    """One paragraph for the README: how many of the family carry a verdict, each verdict's mean and corrected
    interval grouped by measure, then the rest by name (by count past ``HEADLINE_NAMES``), then the sentences
    ``after``."""
    text = _headline_text(comparisons, unit) if comparisons else "No declared comparison has values in both rows."
    return wrapped([" ".join([text, *after])])


def _headline_text(comparisons: dict[str, dict], unit: str) -> str:
    kinds = {name: outcome(c) for name, c in comparisons.items()}
    n = len(next(iter(comparisons.values()))["per_document"])
    groups: dict[str, list[str]] = {}
    for name, c in comparisons.items():
        if kinds[name] == VERDICT:
            measure, pair = name.split(": ", 1)
            groups.setdefault(measure, []).append(
                f"{pair} {c['mean']:+.3f} [{c['corrected'][0]:+.3f}, {c['corrected'][1]:+.3f}]")
    verdicts = sum(kind == VERDICT for kind in kinds.values())
    text = (f"{verdicts} of {len(comparisons)} comparisons carry a verdict over {n} {unit}s (mean, Bonferroni-corrected "
            f"interval)" + (": " + "; ".join(f"{group}: {', '.join(items)}" for group, items in groups.items())
                            if groups else "") + ".")
    for kind, label in ((CONSISTENT, f"Consistent in every {unit}, too few {unit}s for a verdict"),
                        (NONE, "No verdict")):
        names = [name.split(": ", 1)[1] + f" ({name.split(': ')[0]})" for name, k in kinds.items() if k == kind]
        if len(names) > HEADLINE_NAMES:
            text += f" {label}: {len(names)} comparisons."
        elif names:
            text += f" {label}: {', '.join(names)}."
    return text


def wrapped(lines: list[str], width: int = WIDTH) -> list[str]:
    """``lines`` wrapped at ``width`` characters, a bullet's continuation indented under its text."""
    out = []
    for line in lines:
        indent = "  " if line.startswith("- ") else ""
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False) or [""]
    return out


def exploratory(results: dict) -> bool:
    """Whether a run's family was fixed after some of its results were known."""
    return results.get("family", {}).get("exploratory", False)


def family_line(results: dict) -> str:
    """When and how a run's family was declared (results made before families were declared say so)."""
    declared = results.get("family", {}).get("declared")
    label = " Exploratory: its corrections hold only for a family fixed in advance." if exploratory(results) else ""
    return (f"When the family was fixed: {declared}.{label}" if declared else
            "When the family was fixed: not recorded (the run predates declared families).")


def tiny_lines(results: dict, compact: bool = False) -> list[str]:
    """The verdict lines of a tiny-model run's declared family (``seed_comparisons``)."""
    if "family" not in results:
        raise ValueError("this results file declares no family of comparisons (extrapolate --compare)")
    missing = without_values(results)
    return wrapped(sentences(seed_comparisons(results), "seed", compact) + (
        [f"- No value (a row has none at that length): {', '.join(missing)}."] if missing else []) + [
        "", family_line(results)])


def when_fixed(results: dict) -> str:
    """``family_line`` in one sentence, for a headline."""
    if not results.get("family", {}).get("declared"):
        return "When the family was fixed: not recorded."
    return ("Exploratory: the family was fixed after results were seen." if exploratory(results) else
            "The family was declared before the run.")


def tiny_headline(results: dict) -> list[str]:
    """``headline`` of a tiny-model run's declared family, and when it was declared."""
    if "family" not in results:
        raise ValueError("this results file declares no family of comparisons (extrapolate --compare)")
    missing = without_values(results)
    no_value = [f"No value (a row has none at that length): {', '.join(missing)}."] if missing else []
    return headline(seed_comparisons(results), "seed", *no_value, when_fixed(results))


def pretrained_headline(results: dict) -> list[str]:
    """``headline`` of a real-model run's family, and when it was declared."""
    return headline(results["comparisons"], "document", when_fixed(results))


def pretrained_lines(results: dict, compact: bool = False) -> list[str]:
    """The verdict lines of a real-model run's family, and what its context control reads."""
    first, last = results["control"]["context"]
    return wrapped(sentences(results["comparisons"], "document", compact) + [
        "", f"The context control re-reads the document in windows: each target sees {first:,}–{last:,} tokens, not "
            f"the model's whole {last:,}, so a difference to it is a difference to that reading, and no line above "
            "says a row uses more context than the model can read at once.", "", family_line(results)])
