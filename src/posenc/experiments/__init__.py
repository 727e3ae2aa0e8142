"""The commands' experiments, one sub-package per command: ``extrapolate/``, ``tasks/`` (``posenc
task``), ``extend/`` and ``pretrained/`` (``posenc pretrained``), each with its config, its stages and its
report; beside them the pieces they share: ``presets`` (a preset plus the user's flags), ``tables`` (plain-text and
Markdown tables), ``intervals`` (bootstrap and t intervals), ``documents`` (statistics over documents),
``rate_grid`` (a learning rate chosen on dev), ``verdicts`` (one rule for every verdict sentence), ``arguments``
(command-line value types) and ``published`` (the README's and docs' generated tables and verdicts,
``posenc report``). Experiments import the library and ``lm/``, ``extension/``, ``hf``, ``figures/``; nothing
outside this folder but ``cli`` imports from it, and no command imports another's modules, except that ``extend``
calls ``extrapolate``'s public names.
"""
