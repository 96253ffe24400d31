"""horst's optimizers in timm's optimizer registry (``timm.optim``), so that
``timm.optim.create_optimizer_v2(model, opt="horst", lr=..., weight_decay=..., layer_decay=...)``
builds them as it builds timm's own: weight-decay groups without 1-D tensors, layer-wise lr
decay, ``lookahead_`` prefixes.

Names: ``"horst"`` (``HORST``), ``"ham"`` (``HAM``), ``"horstlion"`` (``HORSTLion``),
``"horstsgd"`` (``HORSTSGD``; timm reads ``_`` in a name as a prefix's end, hence no ``horst_sgd``).
``import horst`` registers them in timm's default registry, at once if ``timm.optim`` has been
imported, else when it is (``horst/__init__.py``): horst never imports timm itself. This module
imports timm; ``register(registry)`` adds them to another ``timm.optim.OptimizerRegistry``.
"""

from __future__ import annotations

from timm.optim import OptimInfo, OptimizerRegistry
from timm.optim._optim_factory import default_registry

from horst.adamw import HAM, HORST
from horst.lion import HORSTLion
from horst.sgd import HORSTSGD

OPTIMIZERS = (
    OptimInfo(
        "horst", HORST, "AdamW composed with HORST's hyperbolic mirror step (sparse, prunable weights)", has_betas=True
    ),
    OptimInfo("ham", HAM, "AdamW, then HAM's gradient-driven hyperbolic mirror step", has_betas=True),
    OptimInfo(
        "horstlion", HORSTLion, "Lion composed with HORST's hyperbolic mirror step", has_eps=False, has_betas=True
    ),
    OptimInfo(
        "horstsgd",
        HORSTSGD,
        "SGD (momentum 0.9 in timm) composed with HORST's hyperbolic mirror step",
        has_eps=False,
        has_momentum=True,
    ),
)


def register(registry: OptimizerRegistry = default_registry) -> None:
    """Adds horst's optimizers to ``registry`` (timm's default one); a second call changes nothing."""
    registered = set(registry.list_optimizers())
    for info in OPTIMIZERS:
        if info.name not in registered:
            registry.register(info)
