"""Train a ViT/DeiT under the AC/DC schedule with AdamW, HAM or HORST; report the sparse model.

    python train_vit.py                                         # embedded default (CPU)
    python train_vit.py optimizer=adamw acdc.sparsity=0.8
    python train_vit.py experiment=deit_small_acdc_s90 optimizer=horst data.root=/path/to/imagenet
    torchrun --nproc_per_node=8 train_vit.py experiment=deit_base_acdc_s90 optimizer=horst data.root=...
    python train_vit.py -m hydra/launcher=slurm +study=deit_table data.root=...

Config: configs/train_vit.yaml (recipes in configs/vit_recipe/). The pipeline is
`horst_sparse.vit.run.run`; this file only hands it Hydra's config. It imports its task, so
submitit pickles it by reference.
"""

import sys
from pathlib import Path

import hydra

from horst_sparse.training.presets import check_command_line
from horst_sparse.training.runner import hydra_task
from horst_sparse.vit.config import register_configs
from horst_sparse.vit.run import run

register_configs()


# An absolute path: the configs are found whether this file runs as a script or is imported.
@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="train_vit", version_base="1.3")
def main(cfg):
    return hydra_task(run, cfg)


if __name__ == "__main__":
    check_command_line("vit", sys.argv[1:])
    main()
