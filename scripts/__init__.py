"""Scripts by nature (data preparation, the toy study, the SLURM test cluster), run as
`python scripts/<name>.py`; a package only so that the tests import them as they are."""
