"""Interventions: one frozen object for every change bayes_lens makes to a model, and the one table of operations.

METHODS.md §7 and §13. :class:`Intervention` (layer, site, orthonormal basis, operation, positions,
source, strength, prompts; ``spec``/``digest``; ``pairs(model, batch)`` as TransformerLens pairs) and
the operation table of :mod:`bayes_lens.interventions._ops` - the only code that writes an activation -
serve ``bl.patched``, ``bl.compare_patched``, ``patch_statistic`` and ``bl.localize`` alike; the
runner (:func:`bayes_lens.collect.collect`, ``interventions=``) applies a list of them in one pass.

>>> import bayes_lens as bl
>>> sorted(bl.interventions.OPERATIONS)
['keep_only', 'mean', 'remove', 'resample', 'shift', 'swap']
"""

from ._intervention import POSITIONS, SITES, Intervention, crossfitted, orthonormal
from ._ops import OPERATIONS, apply_op, coordinate_map, keep_along, move_along
from ._subspaces import haar, haar_draw, head_blocks, resample_donors, swap_donors

__all__ = ["Intervention", "OPERATIONS", "POSITIONS", "SITES", "crossfitted", "orthonormal", "apply_op", "coordinate_map",
           "move_along", "keep_along", "haar", "haar_draw", "head_blocks", "swap_donors", "resample_donors"]
