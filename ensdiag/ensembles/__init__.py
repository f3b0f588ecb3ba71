"""Every way an ensemble comes in, as one `Ensemble` (base.py): one adapter module per kind, each
registering itself with `@adapter(name, order)`; nothing keeps a list.

    from ensdiag.ensembles import as_ensemble, measuring
    ensemble = as_ensemble([net_a, net_b])     # or an EnsembleModel, one Module [k,B,C], a callable, files
    with measuring(ensemble, seed=0):          # eval mode and a forked RNG; everything restored after
        logits = ensemble(x)                   # [k, B, C]
"""

from ..registry import import_all
from .base import ADAPTERS, Ensemble, adapter, as_ensemble, measuring, seeded

import_all(__name__)

__all__ = ["ADAPTERS", "Ensemble", "adapter", "as_ensemble", "measuring", "seeded"]
