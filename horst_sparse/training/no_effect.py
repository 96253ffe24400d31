"""The keys of a run's config that change no number the run reports: one list, read by resume
(`horst_sparse.training.runner`), by the tables (`horst_sparse.analysis.runs`, which average runs that differ only in
these) and by the study's stale-run check (`horst_sparse.study.jobs.stale`).

A key is here when two runs that differ only in it train the same model on the same data with
the same arithmetic and measure it the same way. Dotted prefixes cover whole sections.
"""

NO_EFFECT = (
    # where and how a run is recorded; which pipeline ran it is in its other keys (a label)
    "resume",
    "resume_override",
    "logging",
    "hydra",
    "pipeline",
    # where the same data lives (per-job staging on a cluster copies it elsewhere): the data
    # set itself is `data.name` and the recipe's split keys, which stay in
    "data.root",
    "data.dir",
    # how fast: every sample's augmentation is seeded by its own (seed, epoch, index), not by the
    # worker that loads it; compile and thread count keep the arithmetic (up to summation order)
    "data.num_workers",
    "data.pin_memory",
    "cpu_threads",
    # a check that the reproducible CPU mode is in force: it sets nothing (the process's
    # environment does, horst_sparse.cpu_mode), and the mode changes rounding only
    "reproducible_cpu",
    "compile",
    # which kernels compute the same functions on the same batches (horst_sparse.training.engine): rounding only;
    # a run's signature still names an engine other than the default (SIGNED_UNLESS_DEFAULT)
    "engine",
    # the ViT's micro-batches per update: the same global batch, accumulated (summation order only)
    "train.accum_steps",
    "model.max_images_per_pass",  # a guard on the passes' size, checked before any work
    # an unreadable image fails a run without it; with it the run goes on and counts what it skipped
    "data.skip_corrupt",
    # how often the run logs, checkpoints and measures its progress; the final numbers are
    # measured on everything after training
    "train.log_interval",
    "train.eval_interval",
    "train.eval_windows",
    "train.checkpoint_interval",
    "train.keep_checkpoints",
    "train.peak_tflops",
    "train.eval_batch_size",
    "eval.batch_size",
    "acdc.histogram_bins",
    # a copy of the pruned model written after the numbers
    "export",
    # every arm's tuned values (configs/tuned/): they reach a run only through optimizer.* and
    # train.*, which are compared; retuning AdamW does not make a HORST run stale
    "tuned",
    "tuned_as",
    "hparams",
    # a tuning trial's cells: each of its runs has its cell's values in the keys it names
    "tune_over",
)

# Keys of NO_EFFECT that a run's recorded signature (horst_sparse.analysis.runs.signature) names where
# they differ from their default: runs of another engine round otherwise, so a study's cells say which
# engine made them, and its stale-run check tells them apart; a run at the default (every run of
# protocols v1-v6, which record no engine) keeps the signature it had.
SIGNED_UNLESS_DEFAULT = {"engine": "reference"}


def no_effect(key: str) -> bool:
    """Whether the dotted `key` (or its section) is in NO_EFFECT."""
    return any(key == k or key.startswith(k + ".") for k in NO_EFFECT)
