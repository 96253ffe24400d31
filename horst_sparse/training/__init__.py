"""What both pipelines share; each pipeline's own code is in its package (`gpt2`, `vit`).

`runner` (the scaffolding around a training loop: start-up, resume check, checkpoints,
preemption, the non-finite guard, errors and failed multirun cells), `optim` (the optimizer
a config names, over the model's param groups), `checkpoint` (atomic save, safe load, RNG
state), `run_log` (JSONL metrics, summary, W&B), `distributed` (DDP from torchrun, SLURM or
submitit), `env` (seeds, device, precision), `schedule` (warm-up + cosine LR, timm),
`preemption` (SLURM's pre-timeout signal), `config` (shared schemas and checks, `RunError`),
`presets` (which configs belong to which pipeline), `export` (pruned models for
transformers and timm).
"""
