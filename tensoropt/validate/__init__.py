"""Validation of the cost model against real training steps, and whole-step calibration.

* :mod:`.cases` -- validation models (zoo entries at CPU-friendly sizes) and plan selection;
* :mod:`.worker` -- torchrun measurement worker (median step time, per-rank peak memory);
* :mod:`.fit` -- cost terms (:class:`~tensoropt.cost_terms.CostTerms`: scales, fixed cost per
  step, per collective call, ...) fitted on measured runs;
* :mod:`.published` -- published GPU runs (data/published) as plans;
* :mod:`.report` -- accuracy statistics (median absolute error, Spearman) and plots.

* :mod:`.run` -- :func:`measure_plans`: run plans for real and measure them (public).

Driver: ``scripts/validate.py``.
"""

from .fit import TERMS, CostTerms, fit_calibration, step_features
from .run import measure_plans
from .report import max_abs_rel_error, median_abs_rel_error, rel_errors, spearman

__all__ = ["measure_plans", "TERMS", "CostTerms", "fit_calibration", "step_features", "median_abs_rel_error",
           "max_abs_rel_error", "rel_errors", "spearman"]
