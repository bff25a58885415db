"""SEMDICE (ICLR 2025): state-entropy maximisation in the space of stationary distributions.

Pure tensor functions (no ``nn.Parameter``, no Lightning):

* :mod:`ops.semdice.tabular` -- tabular MDPs: stationary distributions (linear solve and its power-series twin),
  the SEMDICE dual with the chi^2 conjugate (value, closed-form gradient), policy recovery, MLE model from
  counts, state entropy and its normalisation, exact policy gradient of a state(-action) reward.
* :mod:`ops.semdice.maxent` -- the MaxEnt-optimal stationary distribution by convex optimisation (cvxpy + Clarabel).
* :mod:`ops.semdice.deep` -- the deep version's soft-chi^2 closed forms and the particle-based kNN entropy.
"""
