"""Runs into tables, figures and verdicts (the pipelines' results layer; pandas, not torch).

One data model and one path through it:

    found = horst_sparse.analysis.runs.read_runs(["outputs/embedded"])      # run folders -> one tidy frame
    frame = horst_sparse.analysis.runs.read_record(["results/embedded/runs.csv"])   # or a study's committed record
    horst_sparse.analysis.report.write_report(found.frame, "results/embedded")  # tables, claims, headline, figures

`runs` reads, `stats` computes, `tables` aggregates and rounds, `claims` (rules in
`claims.yaml`) judges, `figures` draws, `report` writes a results folder.
"""
