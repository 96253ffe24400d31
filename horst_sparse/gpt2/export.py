"""GPT-2's export: a pruned model as a `transformers` folder with a model card.

`save_pretrained(safe_serialization=True)` (config.json, model.safetensors) plus GPT-2's
tokenizer files, loadable offline with `GPT2LMHeadModel.from_pretrained(out)` and
`AutoTokenizer.from_pretrained(out)`. The model is a pruned copy of the trained one, pruned
as the pipeline's one-shot evaluation prunes (`horst_sparse.gpt2.evaluate.prune_copy`); weights
in float32, pruned entries exact zeros. `export_gpt2` is also the end-of-run switch of the
pipeline (`export.enabled`); `export_run` rebuilds the model of a run folder
(`horst-sparse export --to hf`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import pruning
from horst_sparse.gpt2.data import corpus_tokenizer, gpt2_tokenizer, load_data, read_run_vocabulary
from horst_sparse.gpt2.evaluate import calibration_batches, comparison, evaluate_lm, input_norms, prune_copy
from horst_sparse.gpt2.model import VOCAB_SIZE, build_model
from horst_sparse.training.config import RunError
from horst_sparse.training.export import RunFolder, commits, optimizer_line, plain_mode


def export_gpt2(
    model: torch.nn.Module,
    cfg,
    out: str | Path,
    *,
    sparsity: float,
    method: str,
    pattern: str,
    evaluate,
    calibration_tokens=None,
    evaluation: dict | None = None,
    summary: dict | None = None,
    write: bool = True,
    vocabulary=None,
) -> dict[str, Any]:
    """Prune a copy of the trained `model` as `cfg.prune` prunes (`method`, `pattern`,
    `sparsity`; Wanda calibrated as `prune.calibration_*` say), evaluate it with
    `evaluate(model)` unless `evaluation` (the run's one-shot results) already holds that
    row, and (if `write`: the main process) save it to `out` with the tokenizer and a model
    card. `vocabulary` (GPT-2 ids; None: GPT-2's own) is the run's `data.vocabulary: corpus`
    vocabulary: the tokenizer written is then GPT-2's restricted to it. Returns the card's
    facts (`dir`, `ppl`, ...)."""
    sparsity = pruning.pattern_sparsity(pattern, sparsity)
    norms = None
    if method == "wanda":
        if calibration_tokens is None:
            raise ValueError("a Wanda export needs the training tokens for calibration")
        batches = calibration_batches(
            calibration_tokens,
            context=cfg.model.n_positions,
            windows=cfg.prune.calibration_windows,
            seed=cfg.prune.calibration_seed,
        )
        norms = input_norms(model, pruning.prunable_parameters(model, cfg.prune.preset), batches)
    pruned = prune_copy(
        model,
        preset=cfg.prune.preset,
        method=method,
        pattern=pattern,
        sparsity=sparsity,
        scope=cfg.prune.scope,
        norms=norms,
    )
    weights = pruning.prunable_parameters(pruned, cfg.prune.preset)
    row = _matching_row(evaluation, method, pattern, sparsity)
    if row is None:
        val = evaluate(pruned)
        metrics = {
            "val_loss": val["loss"],
            "ppl": val["ppl"],
            "tokens": val["tokens"],
            "windows": val["windows"],
            "context": val["context"],
            "source": "evaluated at export",
        }
    else:
        metrics = {
            "val_loss": row["val_loss"],
            "ppl": row["ppl"],
            "tokens": evaluation["tokens"],
            "windows": evaluation["windows"],
            "context": evaluation["context"],
            "source": "the run's one-shot evaluation",
        }
    facts = {
        "dir": str(Path(out)),
        "format": "transformers (GPT2LMHeadModel, safetensors) + GPT-2 tokenizer",
        "vocabulary": "GPT-2's 50257 tokens"
        if vocabulary is None
        else (
            f"the {len(vocabulary):,} tokens of the training corpus's compact vocabulary (GPT-2's BPE segmentation, "
            "renumbered; its tokenizer is GPT-2's restricted to them)"
        ),
        "method": method,
        "pattern": pattern,
        "sparsity": sparsity,
        "measured_sparsity": pruning.sparsity_stats(weights)["overall"],
        "comparison": comparison(method, pattern, cfg.prune.scope),
        **metrics,
    }
    if write:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        pruned.save_pretrained(out, safe_serialization=True)
        plain_mode(out.glob("*.safetensors"))  # safetensors writes them 0600, unlike every other file here
        (gpt2_tokenizer() if vocabulary is None else corpus_tokenizer(vocabulary)).save_pretrained(out)
        (out / "README.md").write_text(_gpt2_card(cfg, facts, summary or {}))
    return facts


def _matching_row(evaluation: dict | None, method: str, pattern: str, sparsity: float) -> dict | None:
    """The run's result row of this setting (the dense row for sparsity 0), if it has one."""
    for row in (evaluation or {}).get("results", []):
        if abs(row["sparsity"] - sparsity) > 1e-12:
            continue
        # Rows of runs before methods and patterns existed are magnitude, unstructured.
        if row.get("pattern") == "dense" or (row.get("method", "magnitude"), row.get("pattern", "unstructured")) == (
            method,
            pattern,
        ):
            return row
    return None


def export_run(
    run: RunFolder,
    out: str | Path,
    *,
    sparsity: float | None,
    method: str = "magnitude",
    pattern: str = pruning.UNSTRUCTURED,
) -> dict[str, Any]:
    """Rebuild the trained model of a finished GPT-2 run from its last checkpoint and export
    it pruned (`method`, `pattern`, `sparsity` for unstructured). Its perplexity is the
    run's recorded one when the run evaluated that row, else it is evaluated on the run's
    validation tokens (its data.dir must still exist; Wanda also reads its training tokens)."""
    run_dir, state, cfg, summary = run.path, run.state, run.cfg, run.summary
    if sparsity is None and pattern == pruning.UNSTRUCTURED:
        raise RunError("a GPT-2 export needs --sparsity (e.g. 0.5) or an n:m --pattern (e.g. 2:4)")
    if cfg.train.max_steps != state["step"] or not summary:
        raise RunError(
            f"{run_dir} is not a finished run (checkpoint at step {state['step']} of {cfg.train.max_steps}, "
            f"summary.json {'present' if summary else 'missing'}); finish it first"
        )
    vocabulary = read_run_vocabulary(run_dir)
    vocab_size = state["model"]["transformer.wte.weight"].shape[0]
    if vocab_size != (VOCAB_SIZE if vocabulary is None else len(vocabulary)):
        raise RunError(
            f"{run_dir}: the model has {vocab_size} tokens but the run folder's vocabulary.json is missing or "
            "does not match it; the tokenizer cannot be written without it"
        )
    model = build_model(cfg.model, vocab_size=vocab_size)
    model.load_state_dict(state["model"])
    model.eval()
    context = cfg.model.n_positions
    data = {}

    def tokens():
        if not data:
            loaded = load_data(cfg.data, context=context, is_main=True)
            if loaded.vocab_size != model.config.vocab_size:
                raise RunError(
                    f"{cfg.data.dir} gives a {loaded.vocab_size}-token vocabulary, the run's model has "
                    f"{model.config.vocab_size}; export with the data the run was trained on"
                )
            data["train"], data["val"] = loaded.train, loaded.val
        return data

    def evaluate(m):
        return evaluate_lm(
            m,
            tokens()["val"],
            context=context,
            batch_size=cfg.eval.batch_size,
            device=torch.device("cpu"),
            max_windows=cfg.eval.max_windows,
        )

    return export_gpt2(
        model,
        cfg,
        out,
        sparsity=sparsity if sparsity is not None else 0.0,
        method=method,
        pattern=pattern,
        evaluate=evaluate,
        calibration_tokens=tokens()["train"] if method == "wanda" else None,
        evaluation=summary.get("pruning"),
        summary=summary,
        vocabulary=vocabulary,
    )


# ---- model card ------------------------------------------------------------------------------


def _gpt2_card(cfg, facts: dict, summary: dict) -> str:
    train = summary.get("train", {})
    data = summary.get("data", {})
    pattern = facts["pattern"]
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [gpt2, sparse, pruned, {facts["method"]}, {"unstructured" if pattern == "unstructured" else "semi-structured"}]
---

# GPT-2 ({cfg.model.name}), {facts["method"]} pruning, {pattern}, {facts["sparsity"]:.0%}

A GPT-2 trained with the HORST repository's pipeline (`train_gpt2.py`) and pruned one-shot
(no retraining) after training.

| | |
|---|---|
| optimizer | {optimizer_line(cfg)}, lr={cfg.train.lr} |
| model | {cfg.model.name}: {cfg.model.n_layer} layers, width {cfg.model.n_embd}, {cfg.model.n_head} heads, context {cfg.model.n_positions} |
| vocabulary | {facts["vocabulary"]} |
| training data | {cfg.data.name} ({data.get("train_tokens", "?")} training tokens; {train.get("tokens_trained", "?")} tokens trained over {train.get("steps", "?")} updates), seed {cfg.seed} |
| pruning | {facts["method"]}, pattern {pattern} ({facts["comparison"]}), of the block matrices (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj); embeddings, norms and biases dense |
| sparsity | target {facts["sparsity"]:.4f}, measured {facts["measured_sparsity"]:.4f} of the block matrices (exact zeros) |
| validation | loss {facts["val_loss"]:.4f}, perplexity {facts["ppl"]:.2f} on {facts["tokens"]:,} tokens of {cfg.data.name}'s validation split in {facts["windows"]} non-overlapping windows of {facts["context"]} ({facts["source"]}) |
| provenance | {commits(summary)} |

```python
from transformers import AutoTokenizer, GPT2LMHeadModel
model = GPT2LMHeadModel.from_pretrained("PATH")
tokenizer = AutoTokenizer.from_pretrained("PATH")
```

The weights are stored dense (float32, zeros included). {"The 2:4 pattern runs on sparse tensor cores after `pruning.to_semi_structured_(model.half().cuda())` (Ampere or newer GPU)." if pattern == "2:4" else ""}
"""
