"""The tiny byte-level language model the experiments train: ``model`` (a decoder whose positional encoding is
a config field, with a KV cache), ``data`` (the embedded stdlib corpus or the user's text, split by file, and
its windows), ``train`` (the resumable, data-parallel training loop), ``evaluate`` (bits per byte at many
lengths) and ``runtime`` (device, autocast dtype, DDP rank). It imports only the library core (``checks``,
``storage``, ``encodings``, ``attention``), never ``extension``, ``figures`` or ``experiments``.
"""
