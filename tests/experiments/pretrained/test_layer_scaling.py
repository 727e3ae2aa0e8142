"""Scaling a per-layer-type model's global layers or all of them, read inside its context: each row puts exactly the
RoPE dicts it names on the model, the numbers are the documents' own losses, differences stay paired, an
interrupted run resumes from its files, and the model leaves as it came."""

import json
from types import SimpleNamespace

import pytest
import torch
import transformers

from posenc import hf
from posenc.experiments.pretrained import layer_scaling
from posenc.experiments.pretrained.measure import binned, position_losses

OWN = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
       "full_attention": {"rope_type": "default", "rope_theta": 1e6}}


def tiny_gemma():
    config = transformers.Gemma3TextConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=64, rope_parameters=OWN, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def documents(count=3, length=48):
    g = torch.Generator().manual_seed(1)
    return [{"file": f"src/doc{i}", "start": 0, "ids": torch.randint(3, 256, (length,), generator=g)}
            for i in range(count)]


def rope(model, layer_type):
    params = hf.model_rope_parameters(model, layer_type)
    return params["rope_type"], params["rope_theta"], params.get("factor")


@pytest.mark.parametrize("row, sliding, full", [
    ("none", ("default", 10000.0, None), ("default", 1e6, None)),
    ("yarn, global layers", ("default", 10000.0, None), ("yarn", 1e6, 4.0)),
    ("yarn, every layer", ("yarn", 10000.0, 4.0), ("yarn", 1e6, 4.0)),
    ("linear, global layers", ("default", 10000.0, None), ("linear", 1e6, 4.0)),
    ("linear, every layer", ("linear", 10000.0, 4.0), ("linear", 1e6, 4.0)),
])
def test_each_row_puts_its_dicts_on_the_layer_types_it_names_at_their_own_theta(row, sliding, full):
    model = tiny_gemma()
    layer_scaling.scale(model, "linear, every layer", 4.0, OWN)  # a previous row's state is undone first
    layer_scaling.scale(model, row, 4.0, OWN)
    assert rope(model, "sliding_attention") == sliding and rope(model, "full_attention") == full
    if sliding[0] == "yarn":
        assert hf.model_rope_parameters(model, "sliding_attention")["original_max_position_embeddings"] == 64


def test_the_numbers_are_the_documents_losses_paired_and_the_model_comes_back(tmp_path):
    model, docs = tiny_gemma(), documents()
    plain = model(docs[0]["ids"][None]).logits
    results = layer_scaling.run(model, docs, 4.0, tmp_path, bins=4, log=lambda line: None)
    torch.testing.assert_close(model(docs[0]["ids"][None]).logits, plain, rtol=0, atol=0)  # unscaled again
    assert list(results["rows"]) == list(layer_scaling.ROWS) and results["documents"] == [d["file"] for d in docs]
    layer_scaling.scale(model, "linear, every layer", 4.0, OWN)
    expected = [position_losses(model, d["ids"]).mean().item() for d in docs]
    assert results["rows"]["linear, every layer"]["per_document"] == pytest.approx(expected, abs=1e-6)
    none = results["rows"]["none"]["per_document"]
    comparison = results["comparisons"]["linear, every layer − none"]
    assert list(comparison["per_document"].values()) == pytest.approx([a - b for a, b in zip(expected, none)])
    assert all(d != 0 for d in comparison["per_document"].values())  # exactly 0 where scaling missed the model
    assert comparison["comparisons"] == 4 and comparison["p_holm"] >= comparison["p"]
    mean = results["rows"]["none"]["mean"]
    assert mean["mean"] == pytest.approx(sum(none) / 3) and mean["low"] < mean["mean"] < mean["high"]
    per_document_bands = [binned(position_losses(model, d["ids"]), 4)["loss"] for d in docs]  # still linear
    assert results["rows"]["linear, every layer"]["bands"] == pytest.approx(
        [sum(column) / 3 for column in zip(*per_document_bands)], abs=1e-6)  # the mean over documents per band
    assert results["factor"] == 4.0 and results["length"] == 48 and results["model"]["type"] == "gemma3_text"
    assert results["model"]["context"] == 64 and set(results["model"]["rope_parameters"]) == {
        "sliding_attention", "full_attention"}
    assert results["rows"]["none"]["scaling"] is None and results["rows"]["yarn, global layers"]["scaling"] == {
        "rope_type": "yarn", "layers": "global layers"}
    assert "provenance" in results and results["wall_time_s"] > 0
    assert results["model"]["layers"] == ["sliding_attention", "full_attention"] and results["model"]["window"] == 8
    assert json.loads((tmp_path / "results.json").read_text())["rows"]["none"]["per_document"] == none
    header, body = layer_scaling.table_rows(results)
    assert header[2:] == ["first 12 tokens", "last 12 tokens"] and [line[0] for line in body] == list(results["rows"])
    bands = results["rows"]["none"]["bands"]
    assert body[0][1] == f"{mean['mean']:.4f} [{mean['low']:.4f}, {mean['high']:.4f}]"
    assert body[0][2:] == [f"{bands[0]:.4f}", f"{bands[-1]:.4f}"]


def test_an_interrupted_run_resumes_from_its_files(tmp_path, monkeypatch):
    model, docs = tiny_gemma(), documents()
    first = layer_scaling.run(model, docs, 4.0, tmp_path, log=lambda line: None)
    monkeypatch.setattr(layer_scaling, "position_losses", lambda *a, **k: pytest.fail("re-measured a stored pair"))
    again = layer_scaling.run(model, docs, 4.0, tmp_path, log=lambda line: None)
    assert again["rows"] == first["rows"] and len(list((tmp_path / "losses").rglob("*.json"))) == 5 * 3


def test_a_model_with_one_rope_or_a_factor_of_one_is_refused(tmp_path):
    from posenc.experiments.pretrained.measure import tiny_llama

    with pytest.raises(ValueError, match="one RoPE for every layer; .* needs a per-layer-type model"):
        layer_scaling.run(tiny_llama(), documents(), 4.0, tmp_path)
    for factor in (1.0, float("inf"), True):
        with pytest.raises(ValueError, match="factor must be a number > 1"):
            layer_scaling.run(tiny_gemma(), documents(), factor, tmp_path)


class BytesTokenizer:
    """What HFTokens calls: a tokenizer whose ids are the text's bytes (the tiny model's vocabulary)."""

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=list(text.encode()))


def test_the_command_reads_test_documents_and_writes_the_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hf, "load", lambda name: (tiny_gemma(), BytesTokenizer()))
    assert layer_scaling.main(["--model", "tiny-gemma", "--corpus", "stdlib", "--documents", "2", "--length", "40",
                               "--factor", "2", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [name.split("/")[0] for name in results["documents"]] == ["stdlib", "stdlib"] and results["length"] == 40
    assert "yarn, every layer − none: " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        layer_scaling.main(["--length", "65", "--model", "tiny-gemma", "--out", str(tmp_path)])  # past its 64
    assert "--length 65 is past the model's context (64)" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [(["--factor", "nan"], "factor must be a number > 1"),
                                           (["--factor", "1"], "factor must be a number > 1"),
                                           (["--documents", "0"], "--documents and --length must be at least 2"),
                                           (["--model", "llama", "--length", "40"], "one RoPE for every layer")])
def test_a_careless_command_line_is_one_clear_line(args, message, monkeypatch, capsys, tmp_path):
    from posenc.experiments.pretrained.measure import tiny_llama

    monkeypatch.setattr(hf, "load", lambda name: (tiny_llama() if name == "llama" else tiny_gemma(), BytesTokenizer()))
    with pytest.raises(SystemExit) as exit_:
        layer_scaling.main([*args, "--out", str(tmp_path)])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
