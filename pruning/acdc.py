"""The AC/DC schedule and its optimizer-moment reset.

AC/DC (Peste, Iofinova, Vladu, Alistarh, "AC/DC: Alternating Compressed/DeCompressed
Training of Deep Neural Networks", NeurIPS 2021) trains dense for a warm-up, then
alternates compressed phases (C: a global magnitude mask, recomputed from scratch at
the start of each C phase, held fixed) and decompressed phases (D: all weights train,
pruned ones restart from 0), and ends with a longer D phase and a long final C phase
whose sparse model is the result.

The official 100-epoch ImageNet configs (IST-DASLab/ACDC,
``configs/neurips/iht_imagenet_resnet50_*_ep100.yaml``): dense 0-9; C 10-14, D 15-19,
..., C 70-74; D 75-84; C 85-99. Prune at 10, 20, ..., 70 and 85, restore at 15, 25, ...,
75. Their 200-epoch configs extend the alternation with more 5/5 cycles and keep the
10-epoch D + 15-epoch C ending (prune at 10, ..., 170 and 185; restore at 15, ..., 175).
:class:`ACDCSchedule` builds exactly that shape for any total and phase lengths; the
unit (epochs or steps) is the caller's.

At every restore AC/DC resets the optimizer's momentum: :func:`reset_optimizer_moments`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor

DENSE, COMPRESSED, DECOMPRESSED = "dense", "compressed", "decompressed"
PRUNE, RESTORE = "prune", "restore"


class Phase(NamedTuple):
    name: str  # "dense" | "compressed" | "decompressed"
    start: int  # first epoch (or step) of the phase
    stop: int  # one past the last


class ACDCSchedule:
    """Dense warm-up, then C, D, C, ..., C (lengths ``compressed``/``decompressed``),
    then a final D of ``final_decompressed`` and a final C of ``final_compressed``.

    ``total_epochs`` must be exactly ``dense_warmup + compressed + k * (decompressed +
    compressed) + final_decompressed + final_compressed`` for some k >= 0; anything else
    is a ``ValueError`` that names the nearest totals that fit. All lengths are ints in
    one unit, epochs or optimizer steps. ``dense_warmup`` may be 0 (pruning a pretrained
    model at once); the other lengths must be positive.
    """

    def __init__(
        self,
        total_epochs: int,
        *,
        dense_warmup: int = 10,
        compressed: int = 5,
        decompressed: int = 5,
        final_decompressed: int = 10,
        final_compressed: int = 15,
    ):
        lengths = dict(
            total_epochs=total_epochs,
            dense_warmup=dense_warmup,
            compressed=compressed,
            decompressed=decompressed,
            final_decompressed=final_decompressed,
            final_compressed=final_compressed,
        )
        for argument, value in lengths.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{argument} must be an int, got {value!r}")
            minimum = 0 if argument == "dense_warmup" else 1
            if value < minimum:
                raise ValueError(f"{argument} must be >= {minimum}, got {value}")

        cycle = decompressed + compressed
        shortest = dense_warmup + compressed + final_decompressed + final_compressed
        if total_epochs < shortest or (total_epochs - shortest) % cycle:
            below = shortest + max(0, (total_epochs - shortest) // cycle) * cycle
            above = below + cycle if total_epochs > shortest else shortest
            fits = f"{below} or {above}" if below != above else f"{below}"
            raise ValueError(
                f"ACDCSchedule: total_epochs={total_epochs} does not fit the phases: "
                f"dense_warmup={dense_warmup}, then compressed={compressed} + k x "
                f"(decompressed={decompressed} + compressed={compressed}), then "
                f"final_decompressed={final_decompressed} and final_compressed={final_compressed} "
                f"add up to {shortest} + {cycle}k; nearest totals that fit: {fits}. "
                "Change total_epochs or the phase lengths."
            )

        self.total_epochs = total_epochs
        self.lengths = lengths
        phases = [(DENSE, dense_warmup)] if dense_warmup else []
        phases.append((COMPRESSED, compressed))
        phases += [(DECOMPRESSED, decompressed), (COMPRESSED, compressed)] * ((total_epochs - shortest) // cycle)
        phases += [(DECOMPRESSED, final_decompressed), (COMPRESSED, final_compressed)]
        self.phases: tuple[Phase, ...] = tuple(_consecutive(phases))
        self._starts = [phase.start for phase in self.phases]
        self.prune_epochs: tuple[int, ...] = tuple(p.start for p in self.phases if p.name == COMPRESSED)
        self.restore_epochs: tuple[int, ...] = tuple(p.start for p in self.phases if p.name == DECOMPRESSED)

    def phase(self, epoch: int) -> str:
        """``"dense"``, ``"compressed"`` or ``"decompressed"``."""
        return self._phase_at(epoch).name

    def action(self, epoch: int) -> str | None:
        """``"prune"`` at the first epoch of a C phase, ``"restore"`` at the first of a
        D phase, else None."""
        phase = self._phase_at(epoch)
        if epoch != phase.start:
            return None
        return {COMPRESSED: PRUNE, DECOMPRESSED: RESTORE}.get(phase.name)

    def _phase_at(self, epoch: int) -> Phase:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < self.total_epochs:
            raise ValueError(f"epoch must be an int in [0, {self.total_epochs}), got {epoch!r}")
        return self.phases[bisect.bisect_right(self._starts, epoch) - 1]

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v}" for k, v in self.lengths.items() if k != "total_epochs")
        return f"ACDCSchedule({self.total_epochs}, {options})"


def _consecutive(phases: Iterable[tuple[str, int]]) -> Iterable[Phase]:
    start = 0
    for name, length in phases:
        yield Phase(name, start, start + length)
        start += length


# Optimizer state keys of the first and second moments: AdamW, HAM and HORST ("exp_avg",
# "exp_avg_sq"; "max_exp_avg_sq" under amsgrad), Lion ("exp_avg"), SGD ("momentum_buffer").
FIRST_MOMENT_KEYS = ("exp_avg", "momentum_buffer")
SECOND_MOMENT_KEYS = ("exp_avg_sq", "max_exp_avg_sq")


def reset_optimizer_moments(
    optimizer: torch.optim.Optimizer,
    params: Iterable[Tensor] | Mapping[str, Tensor],
    *,
    first: bool = True,
    second: bool = False,
) -> None:
    """Zero the first (and, with ``second=True``, second) moment buffers of ``params``
    in ``optimizer.state``: AC/DC's momentum reset at every restore. Params without
    state yet are skipped; params the optimizer does not hold are an error."""
    if isinstance(params, Mapping):
        params = params.values()
    elif isinstance(params, Tensor):
        params = [params]
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    keys = (FIRST_MOMENT_KEYS if first else ()) + (SECOND_MOMENT_KEYS if second else ())
    for param in params:
        if id(param) not in held:
            raise ValueError(
                f"a parameter of shape {tuple(param.shape)} is not in the optimizer's param_groups; "
                "pass the parameters the optimizer trains"
            )
        state = optimizer.state.get(param, {})
        for key in keys:
            buffer = state.get(key)
            if isinstance(buffer, Tensor):
                buffer.zero_()
