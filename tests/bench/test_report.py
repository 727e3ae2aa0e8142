"""A bench table as the terminal shows it and as Markdown files keep it, cell by cell."""

from posenc.bench import report

ROPE_ROWS = [
    {"contender": "copy_ (baseline)", "shape": [1, 2, 16, 8], "ms": 0.5, "ratio": 1.0, "ratio_low": 1.0,
     "ratio_high": 1.0},
    {"contender": "posenc rotate_pairs", "shape": [1, 2, 16, 8], "ms": 1.25, "ratio": 2.5, "ratio_low": 2.25,
     "ratio_high": 2.75},
]


def test_the_terminal_table_aligns_its_columns_under_the_title_and_the_machine():
    assert report.plain("rope", ROPE_ROWS, "a machine").splitlines() == [
        "RoPE apply on q and k / copy_ of the same bytes",
        "on a machine",
        "contender            shape     ms    time / copy_ (quartiles)",
        "-------------------  --------  ----  ------------------------",
        "copy_ (baseline)     1×2×16×8  0.50  1.00 (1.00–1.00)",  # no padding after the last cell
        "posenc rotate_pairs  1×2×16×8  1.25  2.50 (2.25–2.75)",
    ]
    assert report.plain("rope", ROPE_ROWS).splitlines()[1].startswith("contender ")  # no machine, no line for it


def test_the_markdown_table_has_its_title_machine_header_and_rule():
    assert report.markdown("rope", ROPE_ROWS, "a machine") == (
        "### RoPE apply on q and k / copy_ of the same bytes\n\nOn a machine.\n\n"
        "| contender | shape | ms | time / copy_ (quartiles) |\n| --- | --- | --- | --- |\n"
        "| copy_ (baseline) | 1×2×16×8 | 0.50 | 1.00 (1.00–1.00) |\n"
        "| posenc rotate_pairs | 1×2×16×8 | 1.25 | 2.50 (2.25–2.75) |\n")
    memory = [{"encoding": "none", "length": 8, "batch": 2, "mib": 1.5, "ratio": 1.0}]
    assert report.markdown("memory", memory) == (
        "### training-step activation memory / NoPE\n\n"
        "| encoding | L | B | backend | MiB saved for backward | / NoPE |\n| --- | --- | --- | --- | --- | --- |\n"
        "| none | 8 | 2 | auto | 1.5 | 1.000 |\n")


def test_a_row_without_quartiles_shows_its_ratio_alone_and_an_error_row_its_error():
    """Older bench files have no quartiles; a long-table row that failed has an error and no numbers."""
    attention = {"encoding": "rope", "backend": "sdpa", "length": 64, "ms": 0.25, "ratio": 0.75}
    assert report.markdown_lines("attention", [attention])[-1] == "| rope | sdpa | 64 | 0.25 | 0.75 |"
    failed = {"encoding": "t5", "B": 1, "H": 2, "T": 3, "Dh": 4, "error": "out of memory", "x_sdpa_nope": None,
              "peak_gib": None}
    timed = {"encoding": "none", "B": 1, "H": 2, "T": 3, "Dh": 4, "ms": 1.5, "x_sdpa_nope": 1.0, "peak_gib": 0.125}
    assert report.markdown_lines("long", [timed, failed])[2:] == [
        "| none | 1 | 2 | 3 | 4 | 1.50 | 1.00 | 0.12 |", "| t5 | 1 | 2 | 3 | 4 | error: out of memory | — | — |"]
