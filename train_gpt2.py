"""Train GPT-2 with AdamW, HAM or HORST, prune it one-shot by magnitude, report perplexity.

    python train_gpt2.py                                     # embedded default (CPU)
    python train_gpt2.py optimizer=adamw train.max_steps=300
    python train_gpt2.py experiment=gpt2_small_slimpajama    # the paper's setting
    torchrun --nproc_per_node=8 train_gpt2.py experiment=gpt2_small_slimpajama
    python train_gpt2.py -m hydra/launcher=slurm_1gpu +study=gpt2_table

Config: configs/train_gpt2.yaml. The pipeline is `horst_sparse.gpt2.run.run`; this file only
hands it Hydra's config. It imports its task, so submitit pickles it by reference.
"""

import sys
from pathlib import Path

import hydra

from horst_sparse.gpt2.config import register_configs
from horst_sparse.gpt2.run import run
from horst_sparse.training.presets import check_command_line
from horst_sparse.training.runner import hydra_task

register_configs()


# An absolute path: the configs are found whether this file runs as a script or is imported.
@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="train_gpt2", version_base="1.3")
def main(cfg):
    return hydra_task(run, cfg)


if __name__ == "__main__":
    check_command_line("gpt2", sys.argv[1:])
    main()
