"""Context extension as such, for any RoPE model and independent of any command: ``methods`` (a method's name
and factor -> Hugging Face ``rope_parameters``), ``search`` (LongRoPE's evolutionary search, model-free: it takes
any objective), ``longrope`` (its seed candidates, a RoPE that scores one candidate per batch row, the LM
objective and transformers' ``longrope`` export), ``finetune`` (continue training at a longer length, recording a
curve, resumable) and ``passkey`` (prompts, keys and answers for retrieval tests). It imports the library core
and ``lm/``; nothing in it knows about run directories or commands.
"""
