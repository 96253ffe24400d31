"""The OmegaConf resolvers the configs may use, registered once for every entry point, test and
SLURM job (training/config.py imports this module).

`sum` lets a control derive a value from the arm it controls instead of copying it, e.g. AdamW
with HORST's total decay: `optimizer.weight_decay: ${sum:${tuned.horst.weight_decay},${tuned.horst.beta}}`.
"""

from __future__ import annotations

from omegaconf import OmegaConf

RESOLVERS = {"sum": lambda *values: sum(values)}

for _name, _resolver in RESOLVERS.items():
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)
