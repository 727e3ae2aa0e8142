import json

import pytest
import torch

from posenc.cli import main
from posenc.kernels import band, offset_lookup
from posenc.verify import check_gradients, check_sinusoid_shift, run_checks, tolerance


def test_verify_passes_in_float64_and_covers_every_claim():
    rows = run_checks("cpu", torch.float64)
    assert all(row.passed for row in rows), [r for r in rows if not r.passed]
    checks = {row.check for row in rows}
    for expected in ("permutation equivariant", "permutation changes outputs", "dog bites man != man bites dog",
                     "scores depend only on offsets (shift 2^20, relative)", "norms preserved (relative)",
                     "interleaved = permuted half", "sdpa agrees with eager", "flex agrees with eager",
                     "KV-cache decoding = full pass (eager)", "frequencies and attention factor = transformers",
                     "channel form = bias form (offset 0)", "channel form = bias form (offset 2^20)",
                     "dog bites man = man bites dog: symmetric in |i-j|, blind to reversal"):
        assert expected in checks
    encodings = {row.encoding for row in rows}
    assert {"none", "rope", "alibi", "t5", "shaw", "transformer_xl", "sinusoidal", "learned", "kerple", "sandwich",
            "fire", "xpos", "cope", "rope+proportional"} <= encodings
    assert {row.encoding for row in rows if row.check.startswith("channel form")} == {"alibi", "sandwich", "transformer_xl"}
    assert {row.encoding for row in rows if row.check.startswith("sdpa gradients")} == {
        "t5", "shaw", "transformer_xl", "kerple", "fire", "cope"}


@pytest.mark.parametrize("kernel", ["lookups", "band"])
def test_gradient_check_catches_a_wrong_backward(kernel, monkeypatch):
    """A Shaw kernel whose value band gets no gradient (the C++ lookup tiles, or the band of diagonals where they do
    not serve): Shaw's row fails, the others still pass."""
    if kernel == "lookups" and offset_lookup.extension() is None:
        pytest.skip("no C++ toolchain to build the lookup kernel")
    if kernel == "band":
        monkeypatch.setattr(offset_lookup, "serves", lambda q: False)
    function = offset_lookup._OffsetLookupAttention if kernel == "lookups" else band._BandAttention
    original = function.backward

    def without_value_band(ctx, grad_out):  # input 4 is the value band in both (None for Transformer-XL's lookups)
        grads = list(original(ctx, grad_out))
        grads[4] = None if grads[4] is None else torch.zeros_like(grads[4])
        return tuple(grads)

    monkeypatch.setattr(function, "backward", staticmethod(without_value_band))
    rows = {row.encoding: row for row in check_gradients(torch.device("cpu"), torch.float32)}
    assert not rows["shaw"].passed and rows["shaw"].error > 1e-2
    assert all(row.passed for name, row in rows.items() if name != "shaw")


def test_sinusoid_residual_is_machine_zero():
    residual = next(r for r in check_sinusoid_shift() if "residual, positions 0..99" in r.check)
    assert residual.error < 1e-12


def test_tolerance_grows_with_position_and_dtype():
    assert tolerance(torch.float64, 10) < tolerance(torch.float32, 10) < tolerance(torch.bfloat16, 10)
    assert tolerance(torch.float32, 2**20) > tolerance(torch.float32, 10)


def test_cli_verify_writes_json_and_exit_code(tmp_path, capsys):
    assert main(["verify", "--dtype", "float32", "--json", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    assert "dog bites man" in out and "0 failed" in out
    saved = json.loads((tmp_path / "v.json").read_text())
    assert saved["dtype"] == "float32" and len(saved["rows"]) > 40


def test_every_device_and_dtype_checks_the_cpu_float32_draws():
    """verify's inputs and parameters are drawn on the CPU in float32, then moved: in float64 they are the float32
    draws exactly, so a device's own generator cannot hand one device weaker inputs (Kerple's r1 once all clamped
    on an H200)."""
    from posenc.verify import _encoding, _qkv

    torch.manual_seed(5)
    narrow = (*_qkv("cpu", torch.float32), *_encoding("kerple", "cpu", torch.float32).parameters())
    torch.manual_seed(5)
    wide = (*_qkv("cpu", torch.float64), *_encoding("kerple", "cpu", torch.float64).parameters())
    for a, b in zip(narrow, wide, strict=True):
        assert b.dtype == torch.float64 and torch.equal(a.double(), b)
