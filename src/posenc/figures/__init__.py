"""Every picture posenc draws, each a function returning a matplotlib Figure: ``encodings`` (the seeds' figures
of the encodings themselves), ``trained`` (a learned table and attention maps of trained models), ``extrapolate``,
``extend`` and ``pretrained`` (the figures of each command's results dict), ``style`` (headless backend, one
colour per row, atomic PNG saving) and ``plot`` (``posenc plot``'s assembly). Figures take tensors, models and
results dicts; they import the library and ``lm/``, never ``experiments`` (which calls them).
"""
