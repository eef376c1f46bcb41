"""The operation table: the only code in bayes_lens that writes an activation.

Every intervention of the package - an entropy axis's removal, shift and keep-only (Paper A §4.5-4.6,
METHODS.md §7), their random controls, a subspace's removal, mean- and resample-ablation, the swap
(interchange) and the shift of a decoded statistic (METHODS.md §13), the attached coordinate hook
point's feedback - changes a site's rows with the functions of this module. With B ``[d, k]`` an
orthonormal basis, s the strength, μ a fixed reference row and r_i prompt i's source row:

=============  =====================================================  ==========================================
operation      h' =                                                   reference
=============  =====================================================  ==========================================
``remove``     h − s·BBᵀh                                             projection removal (s = 1: zero-ablation of
                                                                      the span)
``mean``       h − s·BBᵀ(h − μ)                                       mean-ablation
``resample``   h − s·BBᵀ(h − r_i)                                     resample-ablation (causal scrubbing's
                                                                      resampling, r_i a random donor's row)
``swap``       h + s·(r_i − h)·BBᵀ                                    interchange, the convention of TL 4.3's
                                                                      ``tools/analysis/interchange``
``shift``      h + s·B₁ (no source) or h + s·r_i                      steering / a decoded statistic's move
``keep_only``  BBᵀh, or μ + BBᵀ(h − μ)                                keep-only
=============  =====================================================  ==========================================

``remove``, ``mean`` and ``resample`` run as k rank-one moves along the orthonormal columns in turn
(for orthonormal u₁…u_k, Π(I − u_j u_jᵀ) = I − BBᵀ), each by :func:`move_along` with the coordinate
map of :func:`coordinate_map` - the route the flagship axis removal has always taken, so a rank-one
subspace and the axis give the same bits. ``swap`` and ``keep_only`` are the closed forms above.
Arithmetic is float32 (float64 kept) whatever the model's dtype; the result has the activation's dtype.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["OPERATIONS", "move_along", "keep_along", "coordinate_map", "apply_op", "apply_at", "site_rows"]

#: the operations, in the order of the table above
OPERATIONS = ("remove", "mean", "resample", "swap", "shift", "keep_only")


def site_rows(act: Tensor, dim: int, what: str) -> Tensor:
    """``act`` as ``[..., dim]`` rows in float32/float64 (``hook_v``'s ``[batch, pos, head, d_head]``
    flattened over heads), or InvalidInputError naming ``what`` when its width is not ``dim``."""
    flat = act.flatten(-2) if act.ndim == 4 else act
    if flat.shape[-1] != dim:
        raise InvalidInputError(
            f"{what} has dimension {dim} but the activation there is {list(act.shape)} ({flat.shape[-1]} per "
            "position); the axis was fitted on another model or site.")
    return flat if flat.dtype in (torch.float32, torch.float64) else flat.float()


def _on_device(u: Tensor, like: Tensor, cache: Optional[dict]) -> Tensor:
    key = (like.device, like.dtype)
    out = None if cache is None else cache.get(key)
    if out is None:
        out = u.to(device=like.device, dtype=like.dtype)
        if cache is not None:
            cache[key] = out
    return out


def move_along(act: Tensor, u: Tensor, edit: Callable[[Tensor], Tensor], *, what: str,
               cache: Optional[dict] = None) -> Optional[Tensor]:
    """``act`` with its coordinate c = x·u (x: each position's row, u a unit vector) changed to ``edit(c)``.

    x ← x + (edit(c) − c)·u at every position; ``c`` is ``[..., 1]``. Zeroing it is the projection
    removal x − (x·u)u, c ↦ (1 − λ)c the partial removal, c ↦ c + s the shift by s·u. Returns None
    when ``edit`` changed nothing (and no gradient flows through it): the activation runs on as it
    was. The result has ``act``'s shape and dtype (the arithmetic is float32 for bf16/fp16).
    """
    work = site_rows(act, u.shape[0], what)
    u = _on_device(u, work, cache)
    c = (work @ u).unsqueeze(-1)  # [..., 1]
    c_new = edit(c)
    if not (torch.is_grad_enabled() and c_new.requires_grad) and torch.equal(c_new, c):
        return None  # read-only edits (caching hooks): the model runs exactly as without them
    moved = work + (c_new.to(work.dtype) - c) * u  # identity edits give ∂moved/∂x = I
    return moved.to(act.dtype).reshape(act.shape)


def keep_along(act: Tensor, u: Tensor, mean: Optional[Tensor] = None, *, what: str) -> Tensor:
    """``act`` with only its component along ``u`` kept: x ← (x·u)u, or μ + ((x − μ)·u)u with ``mean`` μ."""
    work = site_rows(act, u.shape[0], what)
    u = _on_device(u, work, None)
    if mean is None:
        out = (work @ u).unsqueeze(-1) * u
    else:
        mu = _on_device(mean, work, None)
        out = mu + ((work - mu) @ u).unsqueeze(-1) * u
    return out.to(act.dtype).reshape(act.shape)


def coordinate_map(op: str, u: Tensor, strength: float, ref: Optional[Tensor], *, what: str
                   ) -> Callable[[Tensor], Tensor]:
    """What a rank-one move does to the coordinate c = x·u: removal c ↦ (1 − s)c, centred on a reference row
    (``mean``/``resample``: c ↦ c − s(c − ref·u), ``ref`` ``[d]`` or ``[rows, d]`` one per leading row of c),
    shift c ↦ c + s. The one definition, for an axis and for its random controls alike."""
    if op == "shift":
        return lambda c: c + strength
    if ref is None:
        return lambda c: c * (1.0 - strength)
    if ref.ndim == 2:  # one reference row per prompt

        def per_row(c):
            if ref.shape[0] != c.shape[0]:
                raise InvalidInputError(f"{what} holds {ref.shape[0]} per-prompt rows but the batch has "
                                        f"{c.shape[0]} prompts; build it for this batch's prompts.")
            o = (ref.double() @ u.double()).to(device=c.device, dtype=c.dtype)
            return c - strength * (c - o.reshape(-1, *([1] * (c.ndim - 1))))
        return per_row
    offset = float(ref.double() @ u.double())
    return (lambda c: c * (1.0 - strength)) if offset == 0.0 else (lambda c: c - strength * (c - offset))


def apply_op(op: str, rows: Tensor, directions: Optional[Tensor], strength: float, ref: Optional[Tensor], *,
             what: str) -> Tensor:
    """``rows`` ``[m, ..., d]`` (float32/64) after ``op`` (the module's table); ``directions`` ``[d, k]``
    orthonormal columns (None only for a shift by ``ref``), ``ref`` None, ``[d]`` or ``[m, d]``."""
    if op in ("remove", "mean", "resample") or (op == "shift" and ref is None):
        y = rows
        for j in range(directions.shape[1]):
            u = directions[:, j].contiguous()
            moved = move_along(y, u, coordinate_map("shift" if op == "shift" else op, u, strength,
                                                    None if op in ("remove", "shift") else ref, what=what), what=what)
            y = y if moved is None else moved
        return y
    if op == "shift":  # h + s·r (a whole vector per prompt, or one for all)
        r = ref.to(device=rows.device, dtype=rows.dtype)
        r = r.reshape(r.shape[0], *([1] * (rows.ndim - 2)), r.shape[-1]) if r.ndim == 2 else r
        return rows + (r if strength == 1.0 else strength * r)
    b = directions.to(device=rows.device, dtype=rows.dtype)
    if op == "keep_only":
        if b.shape[1] == 1:
            return keep_along(rows, b[:, 0].contiguous(), ref, what=what)
        mu = None if ref is None else ref.to(device=rows.device, dtype=rows.dtype)
        return (rows @ b) @ b.T if mu is None else mu + ((rows - mu) @ b) @ b.T
    if op == "swap":
        r = ref.to(device=rows.device, dtype=rows.dtype)
        r = r.reshape(r.shape[0], *([1] * (rows.ndim - 2)), r.shape[-1]) if r.ndim == 2 else r
        if strength == 1.0:
            return rows - (rows @ b) @ b.T + (r @ b) @ b.T
        return rows + strength * (((r - rows) @ b) @ b.T)
    raise InvalidInputError(f"unknown operation {op!r}; choose one of {list(OPERATIONS)}.")


def apply_at(op: str, act: Tensor, sel, positions, last_index, directions: Optional[Tensor], strength: float,
             ref: Optional[Tensor], *, what: str) -> Tensor:
    """``act`` (a site's activation ``[batch, pos, ...]``) with ``op`` applied to the rows ``sel`` (batch rows, an
    int array) at ``positions`` (``"all"``, ``"final"`` - ``last_index`` ``[batch]``, None: the last position -
    explicit positions shared by the rows (a tuple of ints), or a list of one tuple per selected row, each row's
    own); ``ref`` None, ``[d]`` or one row per selected row ``[len(sel), d]``. Other rows and positions are
    returned unchanged; the result has ``act``'s shape and dtype."""
    b = act.shape[0]
    flat = act.reshape(b, act.shape[1], -1)
    floaty = flat.dtype in (torch.float32, torch.float64)
    if positions == "all" and len(sel) == b and (ref is None or ref.ndim == 1):
        # the whole activation (an axis's patch): the rows as they are, no copy
        rows = flat if floaty else flat.float()
        return apply_op(op, rows, directions, strength, ref, what=what).to(act.dtype).reshape(act.shape)
    work = flat.clone() if floaty else flat.float()
    rows = torch.as_tensor(sel, device=act.device)
    if positions == "all":
        work[rows] = apply_op(op, work[rows], directions, strength, ref, what=what).to(work.dtype)
    elif positions == "final":
        li = torch.full((b,), act.shape[1] - 1, dtype=torch.long) if last_index is None else \
            torch.as_tensor(last_index).long()
        cols = li.to(act.device)[rows]
        work[rows, cols] = apply_op(op, work[rows, cols], directions, strength, ref, what=what).to(work.dtype)
    elif isinstance(positions, list):  # one tuple of positions per selected row
        if len(positions) != len(sel):
            raise InvalidInputError(f"{what} has positions for {len(positions)} rows but acts on {len(sel)}.")
        local = [j for j, p in enumerate(positions) for _ in p]
        if not local:
            return act
        cols = [c for p in positions for c in p]
        if max(cols) >= act.shape[1]:
            raise InvalidInputError(f"{what} acts at position {max(cols)} but the prompts have "
                                    f"{act.shape[1]} positions.")
        rr = rows[torch.as_tensor(local, device=act.device)]
        cc = torch.as_tensor(cols, device=act.device)
        r = ref if ref is None or ref.ndim == 1 else ref[torch.as_tensor(local, device=ref.device)]
        work[rr, cc] = apply_op(op, work[rr, cc], directions, strength, r, what=what).to(work.dtype)
    else:
        pos = torch.as_tensor(positions, device=act.device)
        if int(pos.max()) >= act.shape[1]:
            raise InvalidInputError(f"{what} acts at position {int(pos.max())} but the prompts have "
                                    f"{act.shape[1]} positions.")
        r = ref if ref is None or ref.ndim == 1 else ref[:, None, :]
        work[rows[:, None], pos[None, :]] = apply_op(op, work[rows][:, pos], directions, strength, r,
                                                     what=what).to(work.dtype)
    return work.to(act.dtype).reshape(act.shape)
