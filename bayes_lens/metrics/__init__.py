"""Pure functions on tensors and arrays: statistics, entropies, PCA, calibration.

No model is ever run in here (METHODS.md §0 "Uncertainty": bootstrap CIs over prompts, seeded).
"""

from .stats import (
    bootstrap_ci,
    entropy_bits,
    pearson,
    permutation_pvalue,
    spearman,
)

__all__ = ["bootstrap_ci", "entropy_bits", "pearson", "spearman", "permutation_pvalue"]
