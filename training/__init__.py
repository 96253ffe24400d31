"""Shared run plumbing for the training entry points (`train_gpt2.py`, `train_vit.py`).

One concept per module: `env` (seeding, device, precision), `distributed` (DDP set-up from
torchrun or SLURM), `run_log` (W&B + JSONL metrics + summary), `checkpoint` (atomic save,
resume), `optim` (AdamW / HAM / HORST from a config), `schedule` (warm-up + cosine LR),
`config` (validation and structured-config schemas), `lm_data` and `perplexity` (token
memmaps and language-model evaluation). Pipeline-specific pieces (schema, model
construction) live in one module per pipeline: `gpt2`.
"""
