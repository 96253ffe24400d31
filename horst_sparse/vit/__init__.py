"""The ViT pipeline: train a timm ViT/DeiT under the AC/DC schedule with any optimizer of
`configs/optimizer/`, report the final sparse model's top-1/top-5 accuracy.

`config` (schemas, checks, the scaled lr and the AC/DC schedule), `model` (timm's
VisionTransformer and its evaluation), `data` (ImageNet folders or the embedded digits
through timm's transforms, seeded loaders that resume mid-epoch), `run` (the pipeline).
"""
