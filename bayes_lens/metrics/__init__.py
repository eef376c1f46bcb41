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

from .calibration import (  # noqa: E402  (SULA calibration metrics, METHODS.md §6)
    binary_entropy_bits,
    brier_score,
    expected_calibration_error,
    kl_bernoulli_bits,
    mae_bits,
    reliability_bins,
)

__all__ += ["binary_entropy_bits", "brier_score", "expected_calibration_error", "kl_bernoulli_bits",
            "mae_bits", "reliability_bins"]

from . import keys, pca  # noqa: E402,F401  (geometry metrics, METHODS.md §1-§2: modules keys, pca)
from .keys import (  # noqa: E402
    gaussian_abs_cosine,
    mean_abs_offdiag_cosine,
    paper_abs_cosine_baseline,
    simulate_gaussian_abs_cosine,
)
from .pca import PCAFit, bootstrap_pca_stats, gaussian_null_pca_stats, participation_ratio  # noqa: E402

__all__ += ["gaussian_abs_cosine", "mean_abs_offdiag_cosine", "paper_abs_cosine_baseline",
            "simulate_gaussian_abs_cosine", "PCAFit", "participation_ratio", "bootstrap_pca_stats",
            "gaussian_null_pca_stats"]

from .._namespace import package_dir, submodule_getattr  # noqa: E402

__dir__ = package_dir(globals())
__getattr__ = submodule_getattr(globals())
