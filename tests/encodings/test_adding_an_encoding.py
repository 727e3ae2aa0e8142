"""An encoding on an existing kind of position term is its module, its registry entry and its test: this file is
all three for a throwaway one, a learned bias −|w_h|·√|i − j| per head, and it needs no other edit. Registered,
it is built by name, served by every backend of ``attention()``, trained by the tiny LM, checked by ``posenc
verify``, timed by ``posenc bench``, offered as a row by ``posenc extrapolate`` and ``posenc task``, and given its
line of docs/guide/api.md's table by ``posenc report``; each of those reads the registry when it is called."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import Tensor, nn

import posenc
from posenc import cli, verify
from posenc.experiments import published
from posenc.bench.attention import bench_attention
from posenc.bench.command import chosen_encodings
from posenc.encodings import PositionalEncoding, build
from posenc.encodings.registry import ENTRIES, Entry, one_axis, register, unregister
from posenc.experiments.extrapolate.rows import parse_rows
from posenc.experiments.tasks import TaskConfig, task_rows

NAME = "sqrt-decay"


class SqrtDecay(PositionalEncoding):
    """−|w_h|·√|i − j|: a score bias of (offset, head), symmetric in the offset, w learned per head."""

    has_bias = True

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, num_heads))

    def bias_at(self, offset: Tensor, head: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        return -self.weight.to(dtype).abs()[head] * offset.abs().to(dtype).sqrt()


@pytest.fixture
def registered():
    entry = register(Entry(NAME, SqrtDecay, "score bias", "a test's own", "learned −|w_h|·√|i − j|", symmetric=True))
    yield entry
    unregister(NAME)


def oracle(q, k, v, weight, causal: bool) -> Tensor:
    """Float64 softmax attention with the bias written from its formula. q, k, v: (B, H, T, Dh); weight: (H,)."""
    length = q.shape[2]
    offset = torch.arange(length, dtype=torch.float64)[:, None] - torch.arange(length, dtype=torch.float64)
    bias = -weight.double().abs()[:, None, None] * offset.abs().sqrt()  # (H, T, T)
    logits = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    if causal:
        logits = logits.masked_fill(offset < 0, float("-inf"))
    return torch.softmax(logits, -1) @ v.double()


@torch.no_grad()
def test_registered_it_is_built_by_name_and_every_backend_serves_it(registered):
    torch.manual_seed(0)
    encoding = posenc.build(NAME, num_heads=3)
    q, k, v = (torch.randn(2, 3, 9, 8) for _ in range(3))
    for causal in (True, False):
        expected = oracle(q, k, v, encoding.weight.detach(), causal)
        for backend in posenc.BACKENDS:
            got = posenc.attention(q, k, v, encoding, causal=causal, backend=backend)
            torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=0, msg=f"{backend}, causal={causal}")
    steps = [posenc.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], encoding,
                              q_positions=torch.tensor([t]), k_positions=torch.arange(t + 1)) for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, 2), posenc.attention(q, k, v, encoding), atol=2e-6, rtol=0)


def test_its_gradients_are_the_oracles(registered):
    encoding = build(NAME, num_heads=2).double()
    inputs = [torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    weight = encoding.weight.detach().clone().requires_grad_()
    upstream = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    got = torch.autograd.grad(posenc.attention(*inputs, encoding), [*inputs, encoding.weight], upstream)
    expected = torch.autograd.grad(oracle(*inputs, weight, causal=True), [*inputs, weight], upstream)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert got[-1].abs().min() > 1e-3  # the weight's gradient is there, not zero


def test_verify_checks_it_and_it_passes(registered):
    rows = [row for row in verify.run_checks() if row.encoding == NAME]
    checks = {row.check for row in rows}
    assert any("must exceed" in row.detail for row in rows)  # positions change outputs
    assert any("symmetric in |i-j|" in check for check in checks)  # its entry says symmetric: reversal is blind
    assert any("KV-cache decoding" in check for check in checks) and any("gradients" in check for check in checks)
    assert rows and all(row.passed for row in rows), [row for row in rows if not row.passed]


def test_bench_times_it(registered):
    assert chosen_encodings(NAME) == ("none", NAME)
    rows = bench_attention(lengths=(16,), rounds=2, encodings=chosen_encodings(NAME))
    assert {row["encoding"] for row in rows} == {"none", NAME} and all(row["ms"] > 0 for row in rows)


def test_the_long_table_times_it_in_a_fresh_process(registered):
    """Each row of ``posenc bench --tables long`` runs in a new process, which registers the encoding again from its
    class's module; a class no new process can import is an error row that says so."""
    from posenc.bench.long_context import registration, run_child, timed_encodings

    assert NAME in timed_encodings()
    row = run_child(NAME, (1, 2, 32, 8), "cpu", "float32", calls=1, timeout=300)
    assert row.get("ms", 0) > 0, row
    in_a_script = type("InAScript", (SqrtDecay,), {"__module__": "__main__"})
    register(Entry("sqrt-decay-script", in_a_script, "score bias", "", ""))
    try:
        row = run_child("sqrt-decay-script", (1, 2, 32, 8), "cpu", "float32", calls=1, timeout=300)
    finally:
        unregister("sqrt-decay-script")
    assert "error" in row and "cannot import" in row["error"], row
    nested = type("Nested", (SqrtDecay,), {"__module__": __name__, "__qualname__": "a_test.<locals>.Nested"})
    register(Entry("sqrt-decay-nested", nested, "score bias", "", ""))
    try:
        with pytest.raises(ValueError, match=r"its class a_test.<locals>.Nested is defined in tests\.encodings"):
            registration("sqrt-decay-nested")
    finally:
        unregister("sqrt-decay-nested")


def test_the_long_table_imports_it_from_where_the_parent_did(tmp_path, monkeypatch):
    """A class in a module only the parent's import path names (the folder of the script that registered it) is
    found by the child too; an entry of that path that is not a string (imports skip it) is left out."""
    from posenc.bench.long_context import run_child

    (tmp_path / "elsewhere_encoding.py").write_text(
        "from tests.encodings.test_adding_an_encoding import SqrtDecay\n\n\n"
        "class Elsewhere(SqrtDecay):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from elsewhere_encoding import Elsewhere

    monkeypatch.setattr(sys, "path", [*sys.path, tmp_path / "a Path, not a str"])

    register(Entry("sqrt-decay-elsewhere", Elsewhere, "score bias", "", ""))
    try:
        row = run_child("sqrt-decay-elsewhere", (1, 2, 32, 8), "cpu", "float32", calls=1, timeout=300)
    finally:
        unregister("sqrt-decay-elsewhere")
    assert row.get("ms", 0) > 0, row


def test_the_tiny_lm_trains_it_as_an_extrapolate_row(registered, tmp_path):
    assert [row.trains for row in parse_rows("all")].count(NAME) == 1 and NAME in one_axis()
    out = tmp_path / "run"
    assert cli.main(["extrapolate", "--preset", "smoke", "--encodings", f"none,{NAME}", "--steps", "2",
                     "--eval-factors", "1,2", "--out", str(out)]) == 0
    rows = {row["name"]: row for row in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {"none", NAME} and rows[NAME]["trained_encoding"] == NAME
    bits = [rows[name]["bits_per_byte"] for name in ("none", NAME)]
    assert all(0 < b < 9 for row in bits for b in row.values()) and bits[0] != bits[1]  # its own model, not the baseline's


def test_the_tasks_offer_it(registered):
    assert NAME in task_rows()
    assert [trains for _, trains, _ in TaskConfig.from_preset("copy", "smoke", encodings=NAME).rows] == [NAME]


def test_posenc_report_writes_its_docs_line(registered):
    lines = published.render("encodings", {}).splitlines()
    assert lines[-1] == f"| `{NAME}` | score bias | a test's own | `num_heads` |"
    assert len(lines) == 2 + len(ENTRIES)  # header, rule, a line per registered encoding


def test_unregistered_it_is_gone_and_names_are_checked(registered):
    with pytest.raises(ValueError, match="is registered already"):
        register(Entry(NAME, SqrtDecay, "score bias", "", ""))
    with pytest.raises(ValueError, match="lower-case"):
        register(Entry("Rope+2", SqrtDecay, "score bias", "", ""))
    with pytest.raises(ValueError, match="PositionalEncoding subclass"):
        register(Entry("plain", nn.Linear, "score bias", "", ""))
    with pytest.raises(ValueError, match="commands' --encodings"):
        register(Entry("all", SqrtDecay, "score bias", "", ""))
    with pytest.raises(ValueError, match="not an encoding register"):
        unregister("rope")
    unregister(NAME)
    assert NAME not in ENTRIES and NAME not in one_axis() and NAME not in posenc.ENCODINGS
    with pytest.raises(ValueError, match="unknown encoding"):
        build(NAME, num_heads=2)
    with pytest.raises(ValueError, match="none was added"):
        unregister(NAME)
    register(Entry("irope", SqrtDecay, "score bias", "", ""))  # a layout's name: the rows refuse it, not silently
    try:
        with pytest.raises(ValueError, match="'irope' has a layout's name"):
            parse_rows("irope")
        with pytest.raises(ValueError, match="'irope' has a layout's name"):
            TaskConfig.from_preset("copy", "smoke", encodings="irope")
    finally:
        unregister("irope")
    register(registered)  # the fixture removes it again
