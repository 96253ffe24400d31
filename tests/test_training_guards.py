"""training.guards: a non-finite loss stops the run and names the last good checkpoint."""

from __future__ import annotations

import pytest

from training.checkpoint import checkpoint_path, save_checkpoint
from training.guards import NonFiniteLossError, check_finite_loss


def test_finite_loss_passes(tmp_path):
    check_finite_loss(2.5, step=1, run_dir=tmp_path)


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_loss_names_the_last_good_checkpoint(tmp_path, loss):
    with pytest.raises(NonFiniteLossError, match="Last good checkpoint: none yet"):
        check_finite_loss(loss, step=3, run_dir=tmp_path)
    path = save_checkpoint({"step": 2}, checkpoint_path(tmp_path, 2))
    with pytest.raises(NonFiniteLossError, match=f"at step 3; .* Last good checkpoint: {path}. Lower train.lr"):
        check_finite_loss(loss, step=3, run_dir=tmp_path)
