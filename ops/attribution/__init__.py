"""Attribution-quality metrics and MDA (Walker, Jha & Ewetz, ICLR 2025): pure tensor/array functions.

``metrics``: RISE insertion/deletion, MAS, monotonicity, positive/negative perturbation AUC, localisation.
``projection``: the convex/concave least-squares curve projection of MDA's magnitude step.
``mda``: SLIC patches, greedy patch-order search (batched and one-by-one), patch magnitudes, the full method.
"""
