"""Quasi-random search for Hydra's optuna sweeper (`configs/hydra/sweeper/sampler/sobol.yaml`, which
`horst-sparse tune` selects): a scrambled Sobol sequence. The points do not depend on the scores,
so every arm of a comparison is searched alike, and trials launched side by side get the points
they would get one by one."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

with warnings.catch_warnings():  # optuna 2.10 (hydra-optuna-sweeper's pin) names SQLAlchemy's pre-2.0 API
    warnings.simplefilter("ignore", DeprecationWarning)
    import optuna

from horst_sparse.training.config import RunError


class SobolSampler(optuna.samplers.BaseSampler):
    """Trial n takes point n of a scrambled Sobol sequence (`scipy.stats.qmc.Sobol`), one coordinate
    per parameter in the order the sweeper first asks for them (the order of `hydra.sweeper.params`).
    This is what optuna's `QMCSampler` does; hydra-optuna-sweeper 1.3 pins optuna < 3, which does
    not have it."""

    MAX_DIMENSIONS = 32

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._dimensions: dict[str, int] = {}
        self._points = np.empty((0, self.MAX_DIMENSIONS))

    def infer_relative_search_space(self, study, trial) -> dict:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict:
        return {}

    def point(self, number: int) -> np.ndarray:
        """Point `number` of the sequence, in [0, 1) per coordinate."""
        from scipy.stats import qmc

        if number >= len(self._points):  # the sequence's first 2^m points, m as small as it can be
            m = max(1, math.ceil(math.log2(number + 1)))
            self._points = qmc.Sobol(self.MAX_DIMENSIONS, scramble=True, seed=self.seed).random_base2(m)
        return self._points[number]

    def sample_independent(self, study, trial, param_name: str, param_distribution) -> Any:
        dimension = self._dimensions.setdefault(param_name, len(self._dimensions))
        if dimension >= self.MAX_DIMENSIONS:
            raise RunError(f"a search space has more than {self.MAX_DIMENSIONS} parameters")
        return from_unit(float(self.point(trial.number)[dimension]), param_distribution)


def from_unit(u: float, distribution) -> Any:
    """The value at quantile `u` in [0, 1) of an optuna distribution."""
    d = optuna.distributions

    def bin_of(count: int) -> int:
        return min(int(u * count), count - 1)

    if isinstance(distribution, d.CategoricalDistribution):
        return distribution.choices[bin_of(len(distribution.choices))]
    if isinstance(distribution, d.IntLogUniformDistribution):
        low, high = math.log(distribution.low), math.log(distribution.high + 1)
        return min(int(math.exp(low + u * (high - low))), distribution.high)
    if isinstance(distribution, d.IntUniformDistribution):
        return (
            distribution.low
            + bin_of((distribution.high - distribution.low) // distribution.step + 1) * distribution.step
        )
    if isinstance(distribution, d.DiscreteUniformDistribution):
        steps = round((distribution.high - distribution.low) / distribution.q)
        return distribution.low + bin_of(steps + 1) * distribution.q
    if isinstance(distribution, d.LogUniformDistribution):
        low, high = math.log(distribution.low), math.log(distribution.high)
        return math.exp(low + u * (high - low))
    if isinstance(distribution, d.UniformDistribution):
        return distribution.low + u * (distribution.high - distribution.low)
    raise RunError(f"the search space uses {type(distribution).__name__}, which the Sobol sampler does not support")
