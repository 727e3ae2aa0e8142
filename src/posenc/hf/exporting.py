"""Export: a model with another RoPE scaling written as a folder ``AutoModelForCausalLM.from_pretrained`` loads.

The folder holds safetensors, config.json (with the new rope_parameters), the tokenizer if given, and
``posenc.json``, whose ``written_by`` marks it as an earlier export that a later one may replace.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .. import storage
from .rope import apply_scaling


def check_export_folder(out_dir: Path, name: str = "export folder") -> None:
    """Refuse a folder that export would wrongly replace: one that exists, is not empty and is not an
    earlier export, or a path through a file (named as ``name``: a command's flag)."""
    storage.check_folder(name, out_dir)
    if out_dir.exists() and not (out_dir / "posenc.json").is_file() and any(out_dir.iterdir()):
        raise ValueError(f"export folder {out_dir} exists and was not written by posenc.hf.export; "
                         "name a new folder (an earlier export in it would be replaced)")


def export(model, rope_parameters: dict, out_dir: str | os.PathLike, tokenizer=None) -> Path:
    """Write ``model`` with ``rope_parameters`` (safetensors + config.json, and the tokenizer if given)
    to ``out_dir``, atomically: the folder appears complete or not at all. An earlier export in
    ``out_dir`` is replaced; any other non-empty folder is refused."""
    out_dir = Path(out_dir)
    check_export_folder(out_dir)
    if getattr(model, "hf_quantizer", None) is not None:
        raise ValueError("this model's weights are quantized "
                         f"({model.hf_quantizer.quantization_config.quant_method}); export writes float weights "
                         "only: load it unquantized")
    apply_scaling(model, rope_parameters)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temp, 0o777 & ~umask)  # mkdtemp's 0700 would make the export private to its writer
    try:
        model.save_pretrained(temp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(temp)
        storage.write_json(temp / "posenc.json", {"rope_parameters": model.config.rope_parameters,
                                                  "written_by": "posenc.hf.export"})
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(temp, out_dir)
    finally:
        if temp.exists():
            shutil.rmtree(temp)
    return out_dir
