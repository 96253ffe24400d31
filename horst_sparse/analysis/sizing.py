"""Seeds sized by power: from the spread a study has measured, the seeds each endpoint needs to
detect the smallest effect that matters, and the effect the seeds it has can detect.

    table = sizing(frame, rules, effects={"top1": 1.0, "ppl": 1.05})

For each `at` endpoint of the rules' claims (one arm against another at one sparsity), from the
per-seed differences of the seeds both arms finished (their std `sd`):

* `detectable`: the smallest true effect the paired t-test at level 1 - confidence detects with
  probability `power` at the seeds measured (stats.detectable_effect);
* `seeds_t`: the seeds that t-test needs for the stated effect, at level alpha / k where k is the
  claim's family (Holm's first step: its smallest adjusted level, so the count holds for any order);
* `seeds`: that count for the primary test of a study that counts divergence (`divergence: worst`):
  divided by the exact signed-rank test's efficiency against the t-test under normal differences
  (3 / pi, its lowest over the location families it is usually applied to is 0.864; 3 / pi is the
  normal case) and by the share of seeds on which neither arm diverged (a diverged pair is ranked,
  not measured: it carries the direction, not the size, of a difference).

The spread is the lever the table shows: the seeds needed grow with (sd / effect)^2, so a recipe
that halves the spread needs a quarter of the seeds.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from horst_sparse.analysis.claims import diverged_seeds, paired_gains, pct, per_seed
from horst_sparse.analysis.matched import final_numbers
from horst_sparse.analysis.stats import detectable_effect

SIGNED_RANK_EFFICIENCY = 3 / math.pi  # Wilcoxon's signed-rank test against the t-test, normal differences
MOST_SEEDS = 1000  # the search's end: an endpoint that needs more is reported as needing more than this


def seeds_needed(sd: float, effect: float, *, alpha: float, power: float) -> int:
    """The fewest pairs whose two-sided paired t-test at level `alpha` detects a true mean
    difference `effect` with probability `power`, at the differences' std `sd`; MOST_SEEDS + 1
    where even MOST_SEEDS do not."""
    if not (math.isfinite(sd) and effect > 0):
        raise ValueError(f"seeds_needed: sd {sd} and effect {effect}: a finite spread and a positive effect")
    low, high = 2, MOST_SEEDS
    if detectable_effect(sd, high, alpha=alpha, power=power) > effect:
        return MOST_SEEDS + 1
    while low < high:  # the detectable effect falls as the pairs grow: bisect on it
        middle = (low + high) // 2
        if detectable_effect(sd, middle, alpha=alpha, power=power) <= effect:
            high = middle
        else:
            low = middle + 1
    return low


def sizing(
    frame: pd.DataFrame, rules: dict[str, Any], effects: dict[str, float], planned: dict[str, int] | None = None
) -> pd.DataFrame:
    """One row per `at` endpoint of `rules`' claims whose metric has a stated effect in `effects`
    (a difference in the metric's unit, or a ratio for a metric of scale `ratio`). `frame`: one
    study's final numbers on one split (several protocol versions' rows must be filtered first).
    `planned` ({pipeline: seeds}): also the effect a study with that many seeds detects
    (`detectable_planned`: the t-test at alpha / family on the seeds the signed-rank test's
    efficiency and the divergence share leave, as `seeds` counts them the other way round)."""
    confidence, power = rules["confidence"], rules["power"]
    alpha = 1 - confidence
    frame = final_numbers(frame)
    rows = []
    for claim in rules["claims"]:
        cells = rules["cells"][claim["pipeline"]]
        specs = [s for s in claim["endpoints"] if "at" in s and s["metric"] in effects and "margin" not in s]
        family = sum(len(s["at"]) for s in claim["endpoints"] if "at" in s) + sum(
            1 for s in claim["endpoints"] if "change" in s
        )
        runs = frame[frame.pipeline == claim["pipeline"]]
        for spec in specs:
            metric = rules["metrics"][spec["metric"]]
            log = metric["scale"] == "ratio"
            effect = math.log(effects[spec["metric"]]) if log else effects[spec["metric"]]
            method, pattern = spec.get("method", cells["method"]), spec.get("pattern", cells["pattern"])
            table = per_seed(frame, claim["pipeline"], spec["metric"], method, pattern)
            ran = set(runs.loc[runs.arm == spec["first"], "seed"]) & set(runs.loc[runs.arm == spec["second"], "seed"])
            lost = (diverged_seeds(runs, spec["first"]) | diverged_seeds(runs, spec["second"])) & ran
            kept = 1 - len(lost) / len(ran) if ran else math.nan
            for s in spec["at"]:
                gains = paired_gains(table, spec["first"], spec["second"], float(s), log=log)
                sd = float(gains.std(ddof=1)) if len(gains) > 1 else math.nan
                detectable = detectable_effect(sd, len(gains), alpha=alpha, power=power)
                needed_t = seeds_needed(sd, effect, alpha=alpha / family, power=power) if math.isfinite(sd) else None
                needed = (
                    math.ceil(needed_t / SIGNED_RANK_EFFICIENCY / kept)
                    if needed_t is not None and needed_t <= MOST_SEEDS and kept > 0
                    else (MOST_SEEDS + 1 if needed_t is not None else None)
                )
                paid = (planned or {}).get(claim["pipeline"])
                usable = math.floor(paid * SIGNED_RANK_EFFICIENCY * kept) if paid and kept > 0 else 0
                at_paid = detectable_effect(sd, usable, alpha=alpha / family, power=power) if paid else math.nan
                rows.append(
                    {
                        "claim": claim["id"],
                        "endpoint": f"{spec['first']} {'/' if log else '−'} {spec['second']} at {pct(float(s))}",
                        "unit": metric["unit"],
                        "n": len(gains),
                        "sd": sd,
                        "detectable": math.exp(detectable) if log else detectable,
                        "effect": effects[spec["metric"]],
                        "family": family,
                        "seeds_t": needed_t,
                        "diverged_share": 1 - kept,
                        "seeds": needed,
                        "planned": paid,
                        "detectable_planned": math.exp(at_paid) if log else at_paid,
                    }
                )
    return pd.DataFrame.from_records(rows)


def _count(seeds: float | None) -> str:
    if seeds is None or not math.isfinite(seeds):
        return "—"  # no spread measured: fewer than two pairs
    return f"> {MOST_SEEDS}" if seeds > MOST_SEEDS else str(int(seeds))


def to_markdown(table: pd.DataFrame, *, confidence: float, power: float) -> str:
    """The sizing table in words a reader checks by hand: every column says what it is."""
    lines = [
        f"| claim | endpoint | pairs now | sd of the pairs | detectable now ({power:.0%} power) | smallest effect "
        f"that matters | family | seeds, paired t at {1 - confidence:g} / family | share of seeds lost to divergence "
        "| seeds, signed-rank counting divergence |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    planned = "planned" in table and table.planned.notna().any()
    if planned:
        lines[0] += " seeds planned | detectable at the planned seeds, counting divergence |"
        lines[1] += "---|---|"
    for row in table.itertuples():
        ratio = row.unit == "ppl ratio"
        shown = (lambda v: f"×{v:.3f}") if ratio else (lambda v: f"{v:.2f}")  # noqa: E731
        lines.append(
            f"| {row.claim} | {row.endpoint} | {row.n} | {row.sd:.3f} | {shown(row.detectable)} | {shown(row.effect)} "
            f"| {row.family} | {_count(row.seeds_t)} | {row.diverged_share:.0%} | {_count(row.seeds)} |"
            + (f" {row.planned:.0f} | {shown(row.detectable_planned)} |" if planned else "")
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`horst-sparse sizing`: the seeds each endpoint needs for the smallest effect that matters, from
    the spread a study's record measured (one protocol version's runs on the rules' split).

        horst-sparse sizing results/embedded/runs.csv --protocol 6 --effect top1=1 --effect ppl=1.05
    """
    import argparse
    import sys
    from pathlib import Path

    from horst_sparse.analysis.claims import RULES, load_rules
    from horst_sparse.analysis.runs import NoRunsError, read_record

    doc = main.__doc__ or ""
    parser = argparse.ArgumentParser(
        prog="horst-sparse sizing",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=doc.split("\n\n", 1)[1],
    )
    parser.add_argument("record", type=Path, help="a study's runs.csv")
    parser.add_argument("--protocol", type=int, help="the protocol version whose runs measure the spread")
    parser.add_argument("--rules", type=Path, default=RULES, help="the claims' rules (default: the current ones)")
    parser.add_argument(
        "--effect", action="append", default=[], metavar="METRIC=VALUE", help="the smallest effect that matters"
    )
    parser.add_argument(
        "--seeds", action="append", default=[], metavar="PIPELINE=N",
        help="the seeds a study plans: also the effect each endpoint detects at them",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the table, with the command, to this markdown file")
    args = parser.parse_args(argv)
    try:
        planned = {p: int(n) for p, _, n in (spec.partition("=") for spec in args.seeds)}
    except ValueError:
        sys.exit(f"error: --seeds {' '.join(args.seeds)}: give PIPELINE=N, e.g. --seeds vit=40")
    rules = load_rules(args.rules)
    effects = {}
    for spec in args.effect:
        metric, _, value = spec.partition("=")
        try:
            effects[metric] = float(value)
        except ValueError:
            effects[metric] = math.nan
        if metric not in rules["metrics"] or not effects[metric] > 0:
            sys.exit(
                f"error: --effect {spec}: give METRIC=VALUE, a metric of the rules ({', '.join(rules['metrics'])})"
            )
    if not effects:
        sys.exit("error: state the smallest effect that matters, e.g. --effect top1=1 --effect ppl=1.05")
    try:
        frame = read_record([args.record])
    except (FileNotFoundError, NoRunsError) as error:
        sys.exit(f"error: {args.record}: {error}")
    if args.protocol is not None:
        if "protocol" not in frame or not (frame.protocol == args.protocol).any():
            sys.exit(f"error: {args.record} has no runs of protocol v{args.protocol}")
        frame = frame[frame.protocol == args.protocol]
    frame = frame[frame.eval_split == rules["split"]]
    table = sizing(frame, rules, effects, planned)
    command = "horst-sparse sizing " + " ".join(sys.argv[2:] if argv is None else argv)
    from horst_sparse.training.run_log import git_commit

    text = (
        f"Written by `{command}` at commit {git_commit(args.record)[:12]} from the record (no run; the same "
        "numbers on any machine): the seeds each endpoint needs to detect the smallest effect that "
        f"matters at {rules['power']:.0%} power, from the spread of the pairs measured "
        "(horst_sparse/analysis/sizing.py says how; sd is of log ratios for perplexity).\n\n"
        + to_markdown(table, confidence=rules["confidence"], power=rules["power"])
    )
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0
