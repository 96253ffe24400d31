"""Seeds sized by power: the fewest seeds whose paired test detects the smallest effect that matters,
from the spread a record measured; the signed-rank test's efficiency and divergence cost seeds."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import record

from horst_sparse.analysis import claims, sizing
from horst_sparse.analysis.stats import detectable_effect

RULES = claims.load_rules()


@pytest.mark.parametrize(("sd", "effect"), [(1.0, 1.0), (4.2, 1.0), (0.4, math.log(1.05))])
def test_the_seeds_needed_are_the_fewest_that_detect_the_effect(sd, effect):
    n = sizing.seeds_needed(sd, effect, alpha=0.05, power=0.8)
    assert (
        detectable_effect(sd, n, alpha=0.05, power=0.8) <= effect < detectable_effect(sd, n - 1, alpha=0.05, power=0.8)
    )


def test_the_seeds_grow_with_the_square_of_the_spread():
    one, two = (sizing.seeds_needed(sd, 0.5, alpha=0.05, power=0.8) for sd in (2.0, 4.0))
    assert 3.8 < two / one < 4.2  # (sd / effect)^2, once the t quantiles are near normal
    assert sizing.seeds_needed(100.0, 0.01, alpha=0.05, power=0.8) == sizing.MOST_SEEDS + 1


def test_a_record_sizes_each_endpoint_and_divergence_costs_seeds():
    rng = np.random.default_rng(0)
    base = 80 + rng.normal(0, 3, 10)
    values = {("adamw", "top1", s): list(base) for s in (0.7, 0.8, 0.9)}
    values |= {("horst", "top1", s): list(base + 1 + rng.normal(0, 2.0, 10)) for s in (0.7, 0.8, 0.9)}
    frame = record(values)
    table = sizing.sizing(frame, RULES, {"top1": 1.0})
    assert table.endpoint.tolist() == [f"horst − adamw at {p} %" for p in (70, 80, 90)]
    row = table.iloc[2]
    assert row.family == 4 and row.n == 10 and row.diverged_share == 0  # 3 sparsities and the change endpoint
    assert row.seeds_t == sizing.seeds_needed(row.sd, 1.0, alpha=0.05 / 4, power=0.8)
    assert row.seeds == math.ceil(row.seeds_t * math.pi / 3)
    frame.loc[(frame.arm == "horst") & frame.seed.isin([0, 1]), "value"] = np.nan  # two of ten diverged
    lost = sizing.sizing(frame, RULES, {"top1": 1.0}).iloc[2]
    assert lost.n == 8 and lost.diverged_share == pytest.approx(0.2)
    assert lost.seeds == math.ceil(lost.seeds_t * math.pi / 3 / 0.8)
    # planned seeds: the effect they detect, on the seeds the signed-rank test and divergence leave
    paid = sizing.sizing(frame, RULES, {"top1": 1.0}, planned={"vit": 40}).iloc[2]
    usable = math.floor(40 * 3 / math.pi * 0.8)
    assert paid.planned == 40 and paid.detectable_planned == sizing.detectable_effect(
        lost.sd, usable, alpha=0.05 / 4, power=0.8
    )
    assert paid.detectable_planned < lost.detectable  # 30 usable pairs against 8


def test_the_command_writes_its_table_and_refuses_bad_input(tmp_path):
    rng = np.random.default_rng(1)
    base = 1 + rng.normal(0, 0.1, 6)
    values = {(arm, "ppl", s): list(np.exp(base + 0.1 * (arm == "horst") + rng.normal(0, 0.05, 6))) for arm in ("adamw", "horst") for s in (0.5, 0.9)}  # fmt: skip
    path = tmp_path / "runs.csv"
    record(values, pipeline="gpt2").assign(protocol=7).to_csv(path, index=False)
    command = [sys.executable, "-m", "horst_sparse.cli", "sizing", str(path)]
    out = tmp_path / "sizing.md"
    done = subprocess.run([*command, "--protocol", "7", "--effect", "ppl=1.05", "--out", str(out)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text() == done.stdout and "| 2 | horst / adamw at 90 % | 6 |" in done.stdout
    assert (
        f"Written by `horst-sparse sizing {path} --protocol 7 --effect ppl=1.05" in done.stdout
        and " at commit " in done.stdout
    )
    for bad, message in (
        (["--effect", "ppl=1.05", "--protocol", "3"], f"error: {path} has no runs of protocol v3"),
        (["--effect", "pl=1.05"], "error: --effect pl=1.05: give METRIC=VALUE, a metric of the rules"),
        (["--effect", "ppl=x"], "error: --effect ppl=x: give METRIC=VALUE"),
        (["--effect", "ppl=1.05", "--seeds", "gpt2=many"], "error: --seeds gpt2=many: give PIPELINE=N"),
        ([], "error: state the smallest effect that matters"),
    ):
        refused = subprocess.run([*command, *bad], capture_output=True, text=True)
        assert refused.returncode != 0 and refused.stderr.startswith(message) and "Traceback" not in refused.stderr
    missing = subprocess.run([*command[:-1], str(Path(tmp_path, "none.csv")), "--effect", "ppl=1.05"], capture_output=True, text=True)  # fmt: skip
    assert missing.returncode != 0 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr
