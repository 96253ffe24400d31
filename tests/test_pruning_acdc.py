"""ACDCSchedule against the official AC/DC configs; moment reset."""

import pytest
import torch
from torch import nn

import pruning

# IST-DASLab/ACDC configs/neurips/iht_imagenet_resnet50_insta_cosinelr_s90_ep100.yaml:
# pruners at epochs [start 10, every 10, end 71] and [85, 20, 100];
# recyclers (restore) at [15, 10, 66] and [75, 20, 86].
OFFICIAL_100 = dict(prune=list(range(10, 71, 10)) + [85], restore=list(range(15, 66, 10)) + [75])
# ..._s95_ep200_unif.yaml: pruners [10, 10, 171] and [185, 20, 200];
# recyclers [15, 10, 166] and [175, 20, 186].
OFFICIAL_200 = dict(prune=list(range(10, 171, 10)) + [185], restore=list(range(15, 166, 10)) + [175])


@pytest.mark.parametrize("total,official", [(100, OFFICIAL_100), (200, OFFICIAL_200)])
def test_default_schedule_matches_official_configs(total, official):
    schedule = pruning.ACDCSchedule(total)
    assert schedule.prune_epochs == tuple(official["prune"])
    assert schedule.restore_epochs == tuple(official["restore"])
    actions = {epoch: schedule.action(epoch) for epoch in range(total)}
    assert [e for e, a in actions.items() if a == "prune"] == official["prune"]
    assert [e for e, a in actions.items() if a == "restore"] == official["restore"]


def test_phases_of_the_100_epoch_schedule():
    schedule = pruning.ACDCSchedule(100)
    compressed = [e for s in range(10, 71, 10) for e in range(s, s + 5)] + list(range(85, 100))
    decompressed = [e for s in range(15, 66, 10) for e in range(s, s + 5)] + list(range(75, 85))
    assert [schedule.phase(e) for e in range(10)] == ["dense"] * 10
    assert [e for e in range(100) if schedule.phase(e) == "compressed"] == compressed
    assert [e for e in range(100) if schedule.phase(e) == "decompressed"] == decompressed
    assert schedule.phases[-2:] == (("decompressed", 75, 85), ("compressed", 85, 100))


def test_small_schedule_in_steps():
    schedule = pruning.ACDCSchedule(
        1200, dense_warmup=200, compressed=200, decompressed=200, final_decompressed=200, final_compressed=200
    )
    assert schedule.prune_epochs == (200, 600, 1000) and schedule.restore_epochs == (400, 800)
    assert schedule.phase(999) == "decompressed" and schedule.phase(1000) == "compressed"
    assert schedule.action(201) is None


def test_no_warmup_and_minimal_schedule():
    schedule = pruning.ACDCSchedule(
        4, dense_warmup=0, compressed=1, decompressed=1, final_decompressed=1, final_compressed=2
    )
    assert [schedule.phase(e) for e in range(4)] == ["compressed", "decompressed", "compressed", "compressed"]
    assert schedule.prune_epochs == (0, 2) and schedule.restore_epochs == (1,)


@pytest.mark.parametrize(
    "total,options,message",
    [
        (101, {}, "nearest totals that fit: 100 or 110"),
        (30, {}, "nearest totals that fit: 40"),
        (0, {}, "total_epochs must be >= 1"),
        (100, {"compressed": 0}, "compressed must be >= 1"),
        (100, {"decompressed": -5}, "decompressed must be >= 1"),
        (100, {"final_compressed": 0}, "final_compressed must be >= 1"),
        (100, {"dense_warmup": -1}, "dense_warmup must be >= 0"),
        (100.0, {}, "total_epochs must be an int"),
        (100, {"compressed": 2.5}, "compressed must be an int"),
    ],
)
def test_invalid_schedules(total, options, message):
    with pytest.raises(ValueError, match=message):
        pruning.ACDCSchedule(total, **options)


def test_epoch_out_of_range():
    schedule = pruning.ACDCSchedule(100)
    for epoch in (-1, 100, 5.0):
        with pytest.raises(ValueError, match="epoch must be"):
            schedule.phase(epoch)


def test_repr_round_trips():
    schedule = pruning.ACDCSchedule(40, dense_warmup=5, final_compressed=10)
    rebuilt = eval(repr(schedule), {"ACDCSchedule": pruning.ACDCSchedule})
    assert rebuilt.phases == schedule.phases


def step(model, optimizer):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("second", [False, True])
def test_reset_adamw_moments(second):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, optimizer)
    weights = pruning.prunable_parameters(model, exclude=())
    pruning.reset_optimizer_moments(optimizer, weights, second=second)
    for name, param in model.named_parameters():
        state = optimizer.state[param]
        reset = name in weights
        assert (state["exp_avg"] == 0).all() == reset, name
        assert (state["exp_avg_sq"] == 0).all() == (reset and second), name
        assert state["step"] == 1  # the bias-correction step count is AdamW's, not reset


def test_reset_sgd_momentum_and_unstepped_params():
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pruning.reset_optimizer_moments(optimizer, [model.weight])  # no state yet: nothing to do
    step(model, optimizer)
    pruning.reset_optimizer_moments(optimizer, model.weight)
    assert (optimizer.state[model.weight]["momentum_buffer"] == 0).all()
    assert (optimizer.state[model.bias]["momentum_buffer"] != 0).any()


def test_reset_horst_lion_moments():
    horst = pytest.importorskip("horst")
    model = nn.Linear(4, 2)
    optimizer = horst.HORSTLion([model.weight], lr=1e-3, alpha=1.0, beta=0.0)
    step(model, optimizer)
    pruning.reset_optimizer_moments(optimizer, [model.weight])
    assert (optimizer.state[model.weight]["exp_avg"] == 0).all()


def test_reset_rejects_foreign_params():
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW([model.weight])
    with pytest.raises(ValueError, match="not in the optimizer"):
        pruning.reset_optimizer_moments(optimizer, [model.bias])
