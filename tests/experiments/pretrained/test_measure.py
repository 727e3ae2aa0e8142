"""``pretrained``'s measurements on their own, on a tiny random Llama and a made-up corpus: the tokenizers, the
chunked prefill against the model's own logits, the bins, which documents are read, and the context control's
sliding windows against a window-by-window oracle. Each would change if a token were dropped, a chunk misaligned,
a window given one token of context more or less than it says, or a document taken out of turn."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from posenc.experiments.pretrained import measure
from posenc.experiments.pretrained.measure import (TINY_CONTEXT, ByteTokens, HFTokens, binned, decoder_and_head,
                                                   layer_progress, load_model, long_documents, method_parameters, position_losses, prefill,
                                                   read_text_tokens, sliding_losses, tiny_llama)
from posenc.lm.data import Corpus, Split


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3, context=64)


def _tokens(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed))


def _full_losses(model, tokens: torch.Tensor) -> torch.Tensor:
    """The oracle: the model's own logits over the whole window, every position scored."""
    with torch.no_grad():
        logits = model(input_ids=tokens[None]).logits[0, :-1].float()
    return F.cross_entropy(logits, tokens[1:], reduction="none")


def test_byte_tokens_round_trip_and_fold_ids_past_a_byte():
    tokens = ByteTokens()
    assert tokens.encode("aé") == [97, 195, 169] and tokens.decode([97, 195, 169]) == "aé"
    assert tokens.decode([256 + 98, 0xFF]) == "b\ufffd"


def test_hf_tokens_ask_for_no_special_tokens_either_way():
    calls = []

    class Tokenizer:
        def __call__(self, text, add_special_tokens):
            calls.append(("encode", text, add_special_tokens))
            return SimpleNamespace(input_ids=[7, 8])

        def decode(self, ids, skip_special_tokens):
            calls.append(("decode", ids, skip_special_tokens))
            return "text"

    tokens = HFTokens(Tokenizer())
    assert tokens.encode("hi") == [7, 8] and tokens.decode([1]) == "text"
    assert calls == [("encode", "hi", False), ("decode", [1], True)]


def test_the_tiny_llama_is_the_documented_model_and_its_seed_decides_its_weights(model):
    config = model.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.max_position_embeddings) == (256, 64, 2, 4, 2, 64)
    assert config.rope_parameters["rope_theta"] == 10000.0 and config.rope_parameters["rope_type"] == "default"
    assert (config.intermediate_size, config.bos_token_id, config.eos_token_id) == (128, 0, 1)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert not model.training
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert 0.15 < weight.std().item() < 0.25  # std 0.2: attention depends on positions
    again, other = tiny_llama(seed=3, context=64), tiny_llama(seed=4, context=64)
    assert torch.equal(again.model.layers[0].self_attn.q_proj.weight, weight)
    assert not torch.equal(other.model.layers[0].self_attn.q_proj.weight, weight)
    assert tiny_llama(seed=3).config.max_position_embeddings == 64
    assert torch.equal(tiny_llama().lm_head.weight, tiny_llama(seed=0).lm_head.weight)


def test_method_parameters_are_the_models_own_for_none_and_the_methods_at_its_theta():
    own = {"rope_type": "default", "rope_theta": 5e5}
    unscaled = method_parameters("none", 2.0, 512, 5e5, own)
    assert unscaled == own and unscaled is not own
    assert method_parameters("yarn", 4.0, 512, 5e5, own) == {
        "rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0, "original_max_position_embeddings": 512}
    assert method_parameters("pi", 2.0, 512, 1e4, own) == {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}


@pytest.mark.parametrize("chunk", [3, 9, 2048])
def test_prefill_scores_every_position_as_the_whole_windows_logits_do(model, chunk):
    tokens = _tokens(10)
    losses, cache = prefill(model, tokens, chunk=chunk)
    assert losses.shape == (9,) and cache is None
    torch.testing.assert_close(losses, _full_losses(model, tokens), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(position_losses(model, tokens, chunk), losses, rtol=0, atol=0)


def test_prefill_keeps_the_cache_a_question_continues_from(model):
    tokens = _tokens(12, seed=1)
    _, cache = prefill(model, tokens[:8], keep_cache=True)
    assert cache.get_seq_length() == 8
    with torch.no_grad():
        continued = model(input_ids=tokens[None, 8:], past_key_values=cache).logits[0, :-1]
    want = _full_losses(model, tokens)[8:]
    got = F.cross_entropy(continued.float(), tokens[9:], reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_layer_progress_hooks_count_each_layer_once_and_are_removed(model, monkeypatch):
    updates = []

    class Bar:
        def __init__(self, total, **_):
            updates.append(("total", total))

        def update(self, n):
            updates.append(n)

        def close(self):
            updates.append("closed")

    monkeypatch.setattr(measure, "tqdm", Bar)
    layers = model.model.layers
    with layer_progress(model.model, "label"):
        assert all(len(layer._forward_hooks) == 1 for layer in layers)
        model.model(input_ids=_tokens(5)[None])
    assert updates == [("total", 2), 1, 1, "closed"]
    assert all(len(layer._forward_hooks) == 0 for layer in layers)
    with layer_progress(SimpleNamespace(), "no layers"):
        pass
    assert updates[-2:] == [("total", 0), "closed"]


def test_decoder_and_head_unwrap_a_peft_model(model):
    assert decoder_and_head(model) == (model.model, model.lm_head)
    wrapped = SimpleNamespace(get_base_model=lambda: model, model=model)
    assert decoder_and_head(wrapped) == (model.model, model.lm_head)


def test_bins_split_positions_evenly_and_skip_unscored_ones():
    losses = torch.tensor([1.0, 2.0, 3.0, float("nan"), 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert binned(losses, 3) == {"bin_edges": [0, 3, 7, 10], "loss": [2.0, pytest.approx(6.0), 9.0]}
    assert binned(losses, 1)["loss"] == [pytest.approx(51.0 / 9)]


def _corpus(documents: dict[str, bytes]) -> Corpus:
    data, starts = bytearray(), []
    for text in documents.values():
        starts.append(len(data))
        data.extend(text + b"\n")
    split = Split(torch.tensor(list(data), dtype=torch.uint8), tuple(documents), tuple(starts))
    return Corpus(split, split, split, {})


def test_long_documents_alternate_sources_longest_first_and_keep_the_first_tokens(monkeypatch):
    documents = {"kjv/Ruth": b"r" * 60, "kjv/Jonah": b"a" * 50, "std/a.py": b"a" * 40, "kjv/Amos": b"z" * 50,
                 "std/b.py": b"b" * 19, "top": b"t" * 25, "std/c.py": b"\xc3\xa9" * 15,  # é: 30 bytes, 15 chars
                 "zed": b"z" * 19 + b"\xff"}
    asked = []
    monkeypatch.setattr(measure, "corpus_of", lambda text, corpus: asked.append((text, corpus)) or _corpus(documents))
    config = SimpleNamespace(text="t.txt", corpus="x", draw="longest", seed=0)
    got = long_documents(config, ByteTokens(), "test", 7, 20)
    assert asked == [("t.txt", "x")]
    # Each source in turn (names without a folder are one source), longest first, then by name
    assert [d["file"] for d in got] == ["kjv/Ruth", "std/a.py", "top", "kjv/Amos", "std/c.py", "zed", "kjv/Jonah"]
    assert all(d["start"] == 0 and d["ids"].dtype == torch.int64 and d["ids"].shape == (20,) for d in got)
    assert got[0]["ids"].tolist() == [ord("r")] * 20 and got[4]["ids"].tolist() == [0xC3, 0xA9] * 10
    assert got[5]["ids"].tolist() == [ord("z")] * 19 + [0xEF]  # a bad byte, replaced by U+FFFD (EF BF BD)
    with pytest.raises(ValueError, match=r"the test split has 7 documents of at least 20 tokens; 8 are needed\. "
                                         r"Pass a --corpus .* fewer --documents / --dev-documents$"):
        long_documents(config, ByteTokens(), "test", 8, 20)

    class Chars:  # a tokenizer of one token per character: c.py's 30 bytes are 15 tokens, too few
        def encode(self, text):
            return [ord(c) for c in text]

    assert "std/c.py" not in [d["file"] for d in long_documents(config, Chars(), "test", 5, 20)]
    assert long_documents(config, Chars(), "test", 8, 16)[-1]["file"] == "std/c.py"  # exactly 16 tokens
    assert [d["file"] for d in long_documents(config, ByteTokens(), "test", 3, 50)] == [
        "kjv/Ruth", "kjv/Amos", "kjv/Jonah"]  # 50 bytes and a newline: long enough
    with pytest.raises(ValueError, match="has 1 documents of at least 60 tokens; 2 are needed"):
        long_documents(config, ByteTokens(), "test", 2, 60)
    with pytest.raises(ValueError, match="has 0 documents of at least 100 tokens; 1 are needed"):
        long_documents(config, ByteTokens(), "test", 1, 100)  # none long enough: no source at all


def test_read_text_tokens_reads_the_split_up_to_its_limit(monkeypatch):
    asked = []
    monkeypatch.setattr(measure, "corpus_of",
                        lambda text, corpus: asked.append((text, corpus)) or _corpus({"a": b"hello", "b": b"w\xffd"}))
    config = SimpleNamespace(text="t.txt", corpus="kjv")
    assert read_text_tokens(config, ByteTokens()).tolist() == list("hello\nw\ufffdd\n".encode())  # test, bad byte replaced
    assert read_text_tokens(config, ByteTokens(), "dev", limit=4).tolist() == list(b"hell")
    assert asked == [("t.txt", "kjv")] * 2


def _sliding_oracle(model, tokens: torch.Tensor, context: int, stride: int, start: int) -> torch.Tensor:
    """Position by position: the window it is scored in ends at its block's end, a multiple of ``stride`` past
    ``start`` (or the last position), and begins ``context`` tokens before that end."""
    last = tokens.shape[0] - 1
    losses = []
    for position in range(start, last):
        end = min(start + ((position - start) // stride + 1) * stride, last)
        first = max(0, end - context)
        losses.append(_full_losses(model, tokens[first : end + 1])[position - first])
    return torch.stack(losses)


@pytest.mark.parametrize("context, stride, start", [(8, 1, 8), (8, 3, 7), (6, 4, 2), (40, 5, 0)])
def test_the_context_control_scores_each_position_with_the_context_it_says(model, context, stride, start):
    tokens = _tokens(21, seed=2)
    got = sliding_losses(model, tokens, context, stride, start, chunk=4)
    assert got.shape == (20 - start,)
    torch.testing.assert_close(got, _sliding_oracle(model, tokens, context, stride, start), rtol=1e-4, atol=1e-4)
    if context >= 20:  # one window holds everything: the plain prefill
        torch.testing.assert_close(got, position_losses(model, tokens)[start:], rtol=1e-4, atol=1e-4)


def test_a_context_of_one_token_more_or_less_changes_the_control(model):
    tokens = _tokens(21, seed=2)
    at = sliding_losses(model, tokens, 8, 1, 8, chunk=4)
    for context in (7, 9):
        assert not torch.allclose(sliding_losses(model, tokens, context, 1, 8, chunk=4), at, atol=1e-4), context


def test_load_model_builds_the_tiny_model_or_loads_one_with_its_tokenizer(monkeypatch):
    model, tokens = load_model(SimpleNamespace(model="tiny", seed=2))
    assert isinstance(tokens, ByteTokens) and model.config.max_position_embeddings == TINY_CONTEXT == 512
    assert torch.equal(model.lm_head.weight, tiny_llama(seed=2, context=512).lm_head.weight)
    loaded = []
    monkeypatch.setattr(measure.hf, "load", lambda name: loaded.append(name) or ("weights", "tokenizer"))
    model, tokens = load_model(SimpleNamespace(model="/models/a", seed=0))
    assert model == "weights" and isinstance(tokens, HFTokens) and tokens.tokenizer == "tokenizer"
    monkeypatch.setattr(measure.hf, "load", lambda name: ("weights", None))
    with pytest.raises(ValueError, match=r"^/models/b has no tokenizer \(tokenizer.json\); posenc pretrained needs one$"):
        load_model(SimpleNamespace(model="/models/b", seed=0))
    assert loaded == ["/models/a"]


def test_a_seeded_draw_shuffles_each_source_and_takes_at_most_half_from_one(monkeypatch):
    documents = {f"kjv/{book}": bytes([65 + i]) * (30 + i) for i, book in enumerate("ABCDEFGH")}
    documents.update({"std/a.py": b"a" * 40, "std/b.py": b"b" * 40, "pd/x": b"x" * 40})
    monkeypatch.setattr(measure, "corpus_of", lambda text, corpus: _corpus(documents))

    def drawn(count, seed=0, split="test", draw="seeded"):
        config = SimpleNamespace(text=None, corpus="x", draw=draw, seed=seed)
        return [d["file"] for d in long_documents(config, ByteTokens(), split, count, 20)]

    six = drawn(6)
    assert sum(f.startswith("kjv/") for f in six) == 3 and {"std/a.py", "std/b.py", "pd/x"} <= set(six)
    assert drawn(6) == six and drawn(6, seed=1) != six and drawn(6, split="dev") != six  # seed and split decide
    kjv = [f for f in drawn(6) if f.startswith("kjv/")]
    assert kjv != ["kjv/H", "kjv/G", "kjv/F"]  # not longest first (seed 0 draws another order)
    assert drawn(6, draw="longest")[:3] == ["kjv/H", "std/a.py", "pd/x"]  # the published order is kept
    with pytest.raises(ValueError, match=r"has 6 documents of at least 20 tokens \(at most half from each source\); "
                                         r"7 are needed"):
        drawn(7)  # 3 of kjv at most, then std and pd run out
