"""The project's SLURM launcher for Hydra (`configs/hydra/launcher/slurm*.yaml`): see
`slurm_launcher`. Hydra finds launchers only inside the `hydra_plugins` namespace package."""
