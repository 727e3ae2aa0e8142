"""Context use (issue #54 item 4): which targets need the long context, and how much of the long reader's gain a
row keeps, against numbers worked by hand."""

import pytest
import torch

from posenc.experiments.documents import t_interval
from posenc.experiments.pretrained import context_use
from posenc.experiments.pretrained.context_use import (CEILING, GAIN, document_use, needing_long_context, save_losses,
                                                       short_context, summarise)

ORIGINAL = 16  # a context of 16 tokens: short reader 4 tokens, targets 0..14 inside, 15.. past


def test_a_target_needs_the_long_context_at_the_thresholds_and_only_past_the_short_readers_reach():
    long = torch.full((20,), 1.0)
    short = long + GAIN  # every gain exactly at the threshold counts
    needed = needing_long_context(long, short, torch.ones(20, dtype=torch.bool), ORIGINAL)
    assert needed.tolist() == [False] * short_context(ORIGINAL) + [True] * (20 - short_context(ORIGINAL))
    short[10] = long[10] + GAIN - 1e-3  # just short of the gain
    long[12], short[12] = CEILING + 1e-3, CEILING + 5  # a large gain, but still lost
    long[13], short[13] = CEILING, CEILING + 5  # a loss exactly at the ceiling counts
    scored = torch.ones(20, dtype=torch.bool)
    scored[14] = False  # a needle's token
    needed = needing_long_context(long, short, scored, ORIGINAL)
    assert [i for i in range(20) if not needed[i]] == [0, 1, 2, 3, 10, 12, 14]


def test_the_kept_share_pools_the_gain_over_a_spans_targets_and_the_spans_split_at_the_contexts_end():
    length = 20
    long, short, row = torch.zeros(length), torch.full((length,), 4.0), torch.full((length,), 9.0)
    needed = torch.zeros(length, dtype=torch.bool)
    needed[[5, 6, 14, 15, 19]] = True  # inside: 5, 6, 14 (the last target inside); past: 15, 19
    long[5], short[5], row[5] = 0.0, 4.0, 2.0  # keeps 2 of 4
    long[6], short[6], row[6] = 1.0, 3.0, 3.0  # keeps 0 of 2
    long[14], short[14], row[14] = 0.5, 2.5, 0.5  # keeps 2 of 2
    long[15], short[15], row[15] = 0.0, 2.0, 4.0  # loses 2 of 2
    long[19], short[19], row[19] = 0.0, 6.0, 0.0  # keeps 6 of 6
    use = document_use(row, long, short, needed, ORIGINAL)
    assert use["inside"]["kept"] == pytest.approx(4 / 8)  # pooled; the mean of the shares would be 1/2 too, so:
    assert use["inside"]["loss"] == pytest.approx((2.0 + 3.0 + 0.5) / 3)
    assert use["past"]["kept"] == pytest.approx((-2 + 6) / (2 + 6))  # pooled 0.5; the mean of shares is 0
    assert use["past"]["loss"] == pytest.approx(2.0)
    none = document_use(row, long, short, torch.zeros(length, dtype=torch.bool), ORIGINAL)
    assert none == {"inside": {"loss": None, "kept": None}, "past": {"loss": None, "kept": None}}


def _document(tmp_path, i, row_losses: dict, long, short):
    save_losses(tmp_path, f"control-test{i}", long)
    save_losses(tmp_path, f"short-test{i}", short)
    for name, losses in row_losses.items():
        save_losses(tmp_path, f"{name}-test{i}", losses)


def _one_target_past_the_context(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The long and short readers' losses (length,): no gain anywhere (no target needed) but at the last target,
    past the context, where the long reader gains 4 nats."""
    long, short = torch.full((length,), 1.0), torch.full((length,), 1.5)
    long[-1], short[-1] = 0.0, 4.0
    return long, short


def test_the_summary_is_read_from_the_files_with_intervals_over_documents(tmp_path):
    length, scored = 20, torch.ones(20, dtype=torch.bool)
    kept_past = []
    for i, row_at_19 in enumerate((1.0, 3.0, 2.0)):  # three documents, one target past the context each
        long, short = _one_target_past_the_context(length)
        _document(tmp_path, i, {"yarn": torch.full((length,), row_at_19), "lost": long.clone()}, long, short)
        kept_past.append((4.0 - row_at_19) / 4.0)
    save_losses(tmp_path, "unfinished-test0", torch.zeros(length))  # a row without every document's file
    assert context_use.losses_path(tmp_path, "yarn-test0") == tmp_path / "measurements" / "losses-yarn-test0.safetensors"
    summary = summarise(tmp_path, ["unfinished", "yarn", "lost"], [scored] * 3, ORIGINAL, control_stride=4)
    assert summary["targets"] == {"inside": [0, 0, 0], "past": [1, 1, 1]}
    assert summary["long"] == {"inside": [1, 16], "past": [13, 16]} and summary["short"] == 4
    assert summary["short_stride"] == 2 and isinstance(summary["short_stride"], int)
    assert list(summary["rows"]) == ["yarn", "lost"]
    cell = summary["rows"]["yarn"]["past"]["kept"]
    low, high = t_interval(kept_past)
    assert (cell["mean"], cell["low"], cell["high"], cell["documents"]) == pytest.approx(
        (sum(kept_past) / 3, low, high, 3))
    assert summary["rows"]["yarn"]["past"]["loss"]["mean"] == pytest.approx(2.0)
    assert summary["rows"]["lost"]["past"]["kept"]["mean"] == pytest.approx(1.0)  # the long reader's own losses
    assert summary["rows"]["yarn"]["inside"] == {"loss": None, "kept": None}  # no document has a target inside
    assert summary["short reader"]["past"]["loss"]["mean"] == pytest.approx(4.0)
    header, body = context_use.table_rows(summary)
    assert header == ["row", "loss inside", "kept inside", "loss past", "kept past"]
    assert body[0] == ["yarn", "—", "—", f"2.000 [{2 - (high - low) * 4 / 2:.3f}, {2 + (high - low) * 4 / 2:.3f}]",
                       f"+{sum(kept_past) / 3:.2f} [{low:+.2f}, {high:+.2f}]"]
    assert body[-1] == ["short reader (≤ 4 tokens)", "—", "+0.00", "4.000 [4.000, 4.000]", "+0.00"]
    assert "1 past it over 3 test documents" not in context_use.description(summary)
    assert "3 past it over 3 test documents" in context_use.description(summary)


def test_the_table_puts_each_cell_in_its_column_and_signs_the_shares():
    def cell(mean):
        return {"mean": mean, "low": mean - 0.5, "high": mean + 0.5, "documents": 3}

    summary = {"short": 2048, "rows": {"yarn": {"inside": {"loss": cell(1.0), "kept": cell(0.25)},
                                                "past": {"loss": cell(2.0), "kept": cell(-0.5)}}},
               "short reader": {"inside": {"loss": cell(3.0)}, "past": {"loss": cell(4.0)}}}
    assert context_use.table_rows(summary)[1] == [
        ["yarn", "1.000 [0.500, 1.500]", "+0.25 [-0.25, +0.75]", "2.000 [1.500, 2.500]", "-0.50 [-1.00, +0.00]"],
        ["short reader (≤ 2,048 tokens)", "3.000 [2.500, 3.500]", "+0.00", "4.000 [3.500, 4.500]", "+0.00"]]


def test_a_cell_takes_two_documents_or_more(tmp_path):
    """Two documents have a t interval; one does not (its cell is empty, not an interval of width 0 or infinity)."""
    length, scored = 20, torch.ones(20, dtype=torch.bool)
    for i, row_at_19 in enumerate((1.0, 3.0)):
        long, short = _one_target_past_the_context(length)
        _document(tmp_path, i, {"yarn": torch.full((length,), row_at_19)}, long, short)
    two = summarise(tmp_path, ["yarn"], [scored] * 2, ORIGINAL, control_stride=4)["rows"]["yarn"]["past"]["loss"]
    low, high = t_interval([1.0, 3.0])
    assert two == pytest.approx({"mean": 2.0, "low": low, "high": high, "documents": 2})
    assert summarise(tmp_path, ["yarn"], [scored], ORIGINAL, control_stride=4)["rows"]["yarn"]["past"]["loss"] is None


def test_a_run_measured_before_the_readers_were_filed_has_no_summary(tmp_path):
    save_losses(tmp_path, "control-test0", torch.zeros(20))
    assert summarise(tmp_path, ["yarn"], [torch.ones(20, dtype=torch.bool)], ORIGINAL, 4) is None
