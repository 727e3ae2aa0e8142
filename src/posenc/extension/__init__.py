"""Context extension as such, for any RoPE model and independent of any command: ``methods`` (a method's name
and factor -> Hugging Face ``rope_parameters``), ``search`` (LongRoPE's evolutionary search, model-free: it takes
any objective), ``longrope`` (its seed candidates, a RoPE that scores one candidate per batch row, the LM
objective and transformers' ``longrope`` export), ``finetune`` (continue training posenc's models at a longer
length, recording a curve, resumable), ``adapt`` (fine-tune a transformers model: PoSE, its control, full length,
LoRA), ``sharding`` (that fine-tuning fully sharded under torchrun), ``self_extend`` (Self-Extend and ReRoPE, in
posenc and in transformers' attention registry), ``shifted`` (STRING), ``dual_chunk`` (Dual Chunk Attention),
``retrieval`` (multi-key needles asked from one KV cache) and ``retrieval_tasks`` (RULER's multi-value and
variable-tracking questions beside them). It imports the library core and ``lm/``; nothing in it knows about run
directories or commands.
"""
