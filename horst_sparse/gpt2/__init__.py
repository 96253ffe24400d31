"""The GPT-2 pipeline: train GPT-2 with any optimizer of `configs/optimizer/`, prune copies
of it one-shot by magnitude, report validation perplexity after pruning.

`config` (schemas and checks), `model` (Hugging Face's GPT2LMHeadModel), `data` (GPT-2 BPE
token memmaps, the embedded pydoc set, random training windows), `evaluate` (perplexity
over non-overlapping windows, one-shot pruning), `run` (the pipeline, top to bottom).
"""
