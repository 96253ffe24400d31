"""The experiment pipelines around `horst` and `pruning`: one namespace, so that an install puts no
generic top-level name (`training`, `analysis`) into anyone's site-packages.

`training` (the scaffolding every pipeline shares, knowing none), `vit` and `gpt2` (one package
per pipeline), `pipeline` (the registry that looks a pipeline up by name), `compose` (Hydra
composition from code), `analysis` (the results layer: pandas, no torch, no Hydra), `study`
(planning, tuning and running a study, above both).
"""

from horst_sparse.cpu_mode import pin

pin()  # before torch and numpy are imported: horst_sparse.cpu_mode
