"""Bernoulli prompts and the predictive P(next symbol = 1 | prefix), from one forward pass per sequence.

A binary sequence x₁ … x_L is rendered as text by a :class:`BernoulliTemplate` (default
``"Sequence: 0 1 1 0"``: a short preamble, then the symbols separated by single spaces). The
predictive for x_t is read from the logits at the token *right before* x_t's token, and renormalized
over the two symbol tokens:

    P(x_t = 1 | x_{<t}) = exp ℓ₁ / (exp ℓ₀ + exp ℓ₁),   ℓ_s = logit of symbol token s there,

with the raw mass exp ℓ₀ + exp ℓ₁ under the full-vocabulary softmax reported alongside. Causal
attention makes every prefix's predictive available from one pass over the whole sequence
(METHODS.md §8: "never run one pass per prefix").

The empty prefix. P(x₁ = 1) is read at the last token of the preamble, so it is the model's
predictive given the preamble alone. With ``prefix=""`` and no BOS token there is no such position
and column 0 is NaN (the diagnostics that need it say so).

Tokenization. Which token carries a symbol depends on the tokenizer: SmolLM2 splits digits, so
``"0 1"`` is ``['0', ' ', '1']`` (symbol tokens ``'0'``/``'1'``, read at the space before them);
GPT-2-style tokenizers merge the space, ``[' 0', ' 1']`` (read at the previous symbol). The layout is
found from the tokenizer's character offsets, per sequence: the token that carries a symbol must end
exactly where the symbol ends and cover nothing but the symbol and whitespace before it. A symbol
that is not one such token, or symbol tokens that differ between positions, raise TokenizationError.

Predictors. Every diagnostic takes either a TransformerLens model or a *predictor*: a callable mapping
an int array ``[batch, L]`` of 0/1 to an array ``[batch, L]`` of P(x_t = 1 | x_{<t}) (column 0 =
empty prefix). :func:`beta_bernoulli` builds the exact Bayes predictives (Laplace's rule = Beta(1,1),
Krichevsky–Trofimov = Beta(½,½)); :func:`clipped_mle` the clipped maximum-likelihood plug-in.

Example
-------
>>> import numpy as np
>>> from bayes_lens.martingale import predictive, laplace
>>> predictive(laplace, [[1, 1, 0]]).tolist()      # (k+1)/(t+2) at t = 0, 1, 2
[[0.5, 0.6666666666666666, 0.75]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import InvalidInputError, TokenizationError
from ..reduced import TAIL_LOGITS, TAIL_LOGSUMEXP

__all__ = [
    "BernoulliTemplate",
    "DEFAULT_TEMPLATE",
    "predictive",
    "beta_bernoulli",
    "laplace",
    "krichevsky_trofimov",
    "clipped_mle",
    "is_model",
    "CategoricalTemplate",
    "symbol_predictive",
]


class _SymbolText:
    """The text of a symbol sequence, shared by the templates: ``prefix`` then the symbols joined by
    ``separator``, and where each symbol stands in it."""

    def render(self, sequence) -> str:
        """The prompt text of one symbol sequence (for Bernoulli: of 0/1)."""
        return self.prefix + self.separator.join(self.symbols[int(x)] for x in sequence)

    def _symbol_spans(self, sequence) -> list:
        spans, pos = [], len(self.prefix)
        for t, x in enumerate(sequence):
            if t:
                pos += len(self.separator)
            s = self.symbols[int(x)]
            spans.append((pos, pos + len(s)))
            pos += len(s)
        return spans


@dataclass(frozen=True)
class BernoulliTemplate(_SymbolText):
    """How a 0/1 sequence becomes a prompt: ``prefix + symbols[x₁] + separator + symbols[x₂] + …``.

    ``prefix`` is the preamble (its last token is where P(x₁) is read; ``""`` leaves P(x₁) undefined
    unless the model prepends BOS). ``symbols`` are the texts of 0 and 1. The default renders
    ``[0, 1, 1]`` as ``"Sequence: 0 1 1"``.
    """

    prefix: str = "Sequence: "
    separator: str = " "
    symbols: Tuple[str, str] = ("0", "1")

    def __post_init__(self):
        if len(self.symbols) != 2 or not all(isinstance(s, str) and s.strip() for s in self.symbols):
            raise InvalidInputError(
                f"symbols must be two non-blank strings (the texts of 0 and 1), got {self.symbols!r}."
            )
        if self.symbols[0] == self.symbols[1]:
            raise InvalidInputError(f"the two symbols must differ, got {self.symbols!r}.")



DEFAULT_TEMPLATE = BernoulliTemplate()


@dataclass(frozen=True)
class CategoricalTemplate(_SymbolText):
    """How a K-symbol sequence (values 0 … K−1) becomes a prompt: ``prefix + symbols[x₁] + separator + …``.

    ``symbols`` are the K texts (K = ``len(symbols)``, 2 … 10); each must be one token inside a
    rendered sequence (checked per sequence against the tokenizer's offsets, as for
    :class:`BernoulliTemplate`). The default is the four digits ``"0" … "3"``;
    ``CategoricalTemplate(symbols=("0", "1"))`` renders exactly as :data:`DEFAULT_TEMPLATE`.
    """

    prefix: str = "Sequence: "
    separator: str = " "
    symbols: Tuple[str, ...] = ("0", "1", "2", "3")

    def __post_init__(self):
        syms = tuple(self.symbols)
        if not 2 <= len(syms) <= 10 or not all(isinstance(s, str) and s.strip() for s in syms):
            raise InvalidInputError(
                f"symbols must be 2 to 10 non-blank strings (the texts of 0 … K−1), got {self.symbols!r}."
            )
        if len(set(syms)) != len(syms):
            raise InvalidInputError(f"the symbols must all differ, got {self.symbols!r}.")
        object.__setattr__(self, "symbols", syms)

    @property
    def n_symbols(self) -> int:
        return len(self.symbols)

    @classmethod
    def digits(cls, n_symbols: int, **kw) -> "CategoricalTemplate":
        """The template whose symbols are the digits ``"0" … str(n_symbols − 1)``."""
        from .._validate import check_int

        k = check_int(n_symbols, "n_symbols", min=2, max=10)
        return cls(symbols=tuple(str(i) for i in range(k)), **kw)



# ----------------------------------------------------------------------------- input checks

def _as_sequences(sequences, *, name: str = "sequences", min_len: int = 1) -> np.ndarray:
    """A validated int64 array ``[n_seq, L]`` of 0/1 from a list of lists, an array or a tensor."""
    if isinstance(sequences, torch.Tensor):
        sequences = sequences.detach().cpu().numpy()
    if isinstance(sequences, np.ndarray):
        arr = sequences
    else:
        seqs = list(sequences)
        if not seqs:
            raise InvalidInputError(f"{name} is empty; pass at least one 0/1 sequence.")
        lengths = {len(s) for s in seqs}
        if len(lengths) != 1:
            raise InvalidInputError(
                f"all {name} must have the same length, got lengths {sorted(lengths)}; "
                "call once per length (gap() does this for you)."
            )
        arr = np.asarray(seqs)
    if arr.ndim == 1:
        raise InvalidInputError(f"{name} must be 2-D [n_seq, seq_len]; wrap one sequence in a list: [seq].")
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise InvalidInputError(f"{name} must be a non-empty 2-D [n_seq, seq_len] array, got shape {arr.shape}.")
    if arr.shape[1] < min_len:
        raise InvalidInputError(f"{name} must have at least {min_len} symbol(s), got length {arr.shape[1]}.")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InvalidInputError(f"{name} must hold only the symbols 0 and 1; found non-integer values.")
    elif arr.dtype.kind not in "iub":
        raise InvalidInputError(f"{name} must hold only the symbols 0 and 1, got dtype {arr.dtype}.")
    arr = arr.astype(np.int64)
    bad = np.setdiff1d(np.unique(arr), [0, 1])
    if bad.size:
        raise InvalidInputError(
            f"{name} must hold only the symbols 0 and 1; found {bad[:5].tolist()}. Map your two outcomes "
            "to 0/1 first (the template decides how they are written)."
        )
    return arr


def is_model(obj) -> bool:
    """True for a TransformerLens model (as opposed to a predictor callable)."""
    from ..adapter import TLModel

    return isinstance(obj, TLModel) and hasattr(obj, "cfg")


def _check_predictor(obj) -> None:
    if is_model(obj):
        return
    if not callable(obj):
        raise InvalidInputError(
            f"expected a TransformerLens model or a predictor callable (0/1 array [b, L] -> P(next=1) "
            f"[b, L]), got {type(obj).__name__}."
        )


# ----------------------------------------------------------------------------- reference predictors

def beta_bernoulli(a: float = 1.0, b: float = 1.0) -> Callable[[np.ndarray], np.ndarray]:
    """The exact Bayes predictive under a Beta(a, b) prior: P(x_t = 1 | x_{<t}) = (k + a)/(t − 1 + a + b).

    ``k`` is the number of ones among the first t − 1 symbols. Beta(1, 1) is Laplace's rule of
    succession, Beta(½, ½) the Krichevsky–Trofimov estimator.
    """
    if not (a > 0 and b > 0):
        raise InvalidInputError(f"Beta prior parameters must be positive, got a={a}, b={b}.")

    def predictor(sequences) -> np.ndarray:
        x = _as_sequences(sequences)
        ones_before = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(x, axis=1)[:, :-1]], axis=1)
        t = np.arange(x.shape[1], dtype=np.float64)
        return (ones_before + a) / (t + a + b)

    predictor.__name__ = f"beta_bernoulli({a:g}, {b:g})"
    predictor.__qualname__ = predictor.__name__
    return predictor


laplace = beta_bernoulli(1.0, 1.0)
laplace.__doc__ = "Laplace's rule of succession, (k + 1)/(t + 2): the Bayes predictive under a uniform prior."
krichevsky_trofimov = beta_bernoulli(0.5, 0.5)
krichevsky_trofimov.__doc__ = "The Krichevsky–Trofimov estimator, (k + ½)/(t + 1): Bayes under Beta(½, ½)."


def clipped_mle(clip: float = 0.01) -> Callable[[np.ndarray], np.ndarray]:
    """The maximum-likelihood plug-in k/t clipped to [clip, 1 − clip]; ½ for the empty prefix."""
    if not 0 < clip < 0.5:
        raise InvalidInputError(f"clip must be in (0, 0.5), got {clip}.")

    def predictor(sequences) -> np.ndarray:
        x = _as_sequences(sequences)
        ones_before = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(x, axis=1)[:, :-1]], axis=1)
        t = np.arange(x.shape[1], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(t > 0, ones_before / np.maximum(t, 1), 0.5)
        return np.clip(p, clip, 1 - clip)

    predictor.__name__ = f"clipped_mle({clip:g})"
    predictor.__qualname__ = predictor.__name__
    return predictor


# ----------------------------------------------------------------------------- layout of symbol tokens

def _encode(tokenizer, text: str):
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def symbol_layout(tokenizer, template: BernoulliTemplate, seq) -> Tuple[list, np.ndarray, dict]:
    """Token ids of the rendered ``seq``, the token index of every symbol, and symbol -> token id."""
    text = template.render(seq)
    try:
        ids, offsets = _encode(tokenizer, text)
    except (NotImplementedError, TypeError, ValueError) as err:  # slow tokenizers have no offsets
        raise TokenizationError(
            "the model's tokenizer cannot report character offsets (a 'fast' tokenizer is needed to "
            f"locate the symbol tokens): {err}"
        ) from err
    spans = template._symbol_spans(seq)
    ends = {}
    for j, (s, e) in enumerate(offsets):
        if e > s:
            ends.setdefault(e, j)
    positions = np.empty(len(seq), dtype=np.int64)
    sym_ids: dict = {}
    for t, (start, end) in enumerate(spans):
        j = ends.get(end)
        ok = j is not None
        if ok:
            ts, te = offsets[j]
            ok = ts <= start and text[ts:start].strip() == "" and (t == 0 or ts >= spans[t - 1][1])
        if not ok:
            pieces = [tokenizer.decode([i]) for i in ids[: min(len(ids), 12)]]
            raise TokenizationError(
                f"symbol {template.symbols[int(seq[t])]!r} at position {t} of {text[:60]!r}… is not a single "
                f"token in this template (tokens: {pieces}…). Choose symbols/separator that tokenize to one "
                "token per symbol, e.g. BernoulliTemplate(separator=' ') or symbols such as ' 0'/' 1'."
            )
        positions[t] = j
        tid = ids[j]
        s = int(seq[t])
        if sym_ids.setdefault(s, tid) != tid:
            raise TokenizationError(
                f"symbol {template.symbols[s]!r} is tokenized differently at different positions "
                f"({tokenizer.decode([sym_ids[s]])!r} vs {tokenizer.decode([tid])!r}); use a separator that "
                "makes every occurrence the same token (the default ' ' works for SmolLM2 and GPT-2)."
            )
    return ids, positions, sym_ids


def _symbol_token_ids(tokenizer, template: BernoulliTemplate) -> Tuple[int, int]:
    """Token ids of symbol 0 and symbol 1 as they appear inside a rendered sequence."""
    _, _, ids = symbol_layout(tokenizer, template, [0, 1, 0, 1])
    if ids[0] == ids[1]:
        raise TokenizationError(f"symbols {template.symbols!r} map to the same token; choose distinct symbols.")
    return int(ids[0]), int(ids[1])


def _bos_prepended(model) -> bool:
    return bool(getattr(model.cfg, "default_prepend_bos", False))


# ----------------------------------------------------------------------------- predictive

def _layouts(model, seqs: np.ndarray, template: BernoulliTemplate):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise InvalidInputError("the model has no tokenizer; attach one (model.set_tokenizer(...)).")
    t0, t1 = _symbol_token_ids(tok, template)
    texts, layouts = [], []
    for seq in seqs:
        ids, positions, sym = symbol_layout(tok, template, seq)
        if any(sym.get(s, tid) != tid for s, tid in ((0, t0), (1, t1))):
            raise TokenizationError("symbol tokens differ between sequences; use a template with a separator.")
        texts.append(template.render(seq))
        layouts.append((ids, positions))
    return texts, layouts, (t0, t1)


def _read_index(ids, positions, toks, bos: bool) -> np.ndarray:
    """Token index at which each symbol's predictive is read (the token before it; -1: none)."""
    offset = 1 if bos and len(toks) > len(ids) and toks[1: len(ids) + 1] == ids else 0
    if toks[offset: offset + len(ids)] != ids:
        raise TokenizationError(
            "the model tokenized a Bernoulli prompt differently from its tokenizer's offsets; "
            "this template cannot be located reliably - try another separator."
        )
    return positions + offset - 1


def _read_predictive(p1, mass, i, ids, positions, toks, logits_row, symbols, bos: bool) -> None:
    """Fill row ``i`` of ``p1``/``mass`` from one prompt's tokens and logits ``[pos, vocab]``."""
    t0, t1 = symbols
    read = _read_index(ids, positions, toks, bos)
    valid = read >= 0
    if not valid.any():
        return
    lg = logits_row[torch.as_tensor(read[valid], device=logits_row.device)].double()
    lse = torch.logsumexp(lg, dim=-1)
    l0, l1 = lg[:, t0], lg[:, t1]
    p1[i, valid] = torch.sigmoid(l1 - l0).cpu().numpy()
    mass[i, valid] = (torch.exp(l0 - lse) + torch.exp(l1 - lse)).cpu().numpy()


def _symbol_logits(model, texts, layouts, symbols, *, batch_size: int, progress: Optional[bool], desc: str):
    """Yield ``(i, valid [L] bool, logits [m, K] of the symbol tokens, full log-sum-exp [m])`` per sequence
    at its read positions, from one run of the runner that keeps the last ``T`` real positions' symbol
    logits (``collect(..., token_ids=symbols, tail_positions=T)``, ``T`` reaching back to the first read
    position of the longest-reaching prompt)."""
    from .. import adapter
    from ..collect import collect

    bos = _bos_prepended(model)
    tokens, mask = adapter.tokenize(model, texts, padding_side="right")
    n_real = mask.sum(1).tolist()
    reads, tail = [], 1
    for i, (ids, positions) in enumerate(layouts):
        read = _read_index(ids, positions, tokens[i, : n_real[i]].tolist(), bos)
        reads.append(read)
        if (read >= 0).any():
            tail = max(tail, int(n_real[i] - read[read >= 0].min()))
    rc = collect(model, texts, token_ids=list(symbols), tail_positions=tail, batch_size=batch_size,
                 padding_side="right", progress=progress, desc=desc)
    tail_logits, tail_lse = rc[TAIL_LOGITS], rc[TAIL_LOGSUMEXP]
    for i, read in enumerate(reads):
        valid = read >= 0
        if not valid.any():
            continue
        j = torch.as_tensor(read[valid] - (n_real[i] - tail))
        yield i, valid, tail_logits[i, j].double(), tail_lse[i, j].double()


def _model_predictive(model, seqs: np.ndarray, template: BernoulliTemplate, *, batch_size: int,
                      progress: Optional[bool], desc: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(p1, mass)`` of a model through the runner (so inside ``bl.shard.sharded(...)`` in shards).

    The runner keeps the two symbol tokens' logits and the log-sum-exp at the last ``T`` real
    positions (``collect(..., token_ids=symbols, tail_positions=T)``, ``T`` reaching back to the first
    read position of the longest-reaching prompt); the predictive is then the same arithmetic as
    :func:`_read_predictive` on the same logits (float32 holds a float32 or bf16 model's logits exactly).
    """
    texts, layouts, symbols = _layouts(model, seqs, template)
    n, L = seqs.shape
    p1 = np.full((n, L), np.nan)
    mass = np.full((n, L), np.nan)
    for i, valid, lg, lse in _symbol_logits(model, texts, layouts, symbols, batch_size=batch_size,
                                            progress=progress, desc=desc):
        l0, l1 = lg[:, 0], lg[:, 1]
        p1[i, valid] = torch.sigmoid(l1 - l0).numpy()
        mass[i, valid] = (torch.exp(l0 - lse) + torch.exp(l1 - lse)).numpy()
    return p1, mass


def predictive_from_logits(model, sequences: Int[np.ndarray | Tensor, "n_seqs seq_len"],
                           logits: Float[Tensor, "n_seqs pos vocab"], tokens: Int[Tensor, "n_seqs pos"], *,
                           template: Optional[BernoulliTemplate] = None, return_mass: bool = False
                           ) -> Float[Tensor, "n_seqs seq_len"] | Tuple[Float[Tensor, "n_seqs seq_len"],
                                                                      Float[Tensor, "n_seqs seq_len"]]:
    """:func:`predictive` from logits you computed: no forward pass.

    ``logits`` ``[n_seq, pos, vocab]`` and ``tokens`` ``[n_seq, pos]`` are those of the rendered
    prompts (``template.render(seq)`` for each sequence, e.g. ``bl.adapter.tokenize(model, texts)`` and
    ``model.run_with_cache(tokens, attention_mask=mask)``; padding on the right). ``model`` gives the
    tokenizer (symbol token ids, positions). Same result as :func:`predictive` on the same rows.
    """
    template = template or DEFAULT_TEMPLATE
    seqs = _as_sequences(sequences)
    logits = torch.as_tensor(logits).detach()
    tokens = torch.as_tensor(tokens)
    if logits.ndim != 3 or tokens.ndim != 2 or logits.shape[:2] != tokens.shape or tokens.shape[0] != seqs.shape[0]:
        raise InvalidInputError(
            f"logits {list(logits.shape)} and tokens {list(tokens.shape)} must be [n_seq, pos, vocab] and "
            f"[n_seq, pos] for the {seqs.shape[0]} sequences.")
    _, layouts, symbols = _layouts(model, seqs, template)
    bos = _bos_prepended(model)
    p1 = np.full(seqs.shape, np.nan)
    mass = np.full(seqs.shape, np.nan)
    for i, (ids, positions) in enumerate(layouts):
        _read_predictive(p1, mass, i, ids, positions, tokens[i].tolist(), logits[i], symbols, bos)
    p, m = torch.from_numpy(p1), torch.from_numpy(mass)
    return (p, m) if return_mass else p


def predict_array(model_or_predictor, seqs: np.ndarray, *, template: Optional[BernoulliTemplate] = None,
             batch_size: int = 8, progress: Optional[bool] = None,
             desc: str = "predictive") -> Tuple[np.ndarray, np.ndarray]:
    """(p1, mass) as float64 numpy arrays ``[n, L]``; mass is NaN for predictor callables."""
    _check_predictor(model_or_predictor)
    if is_model(model_or_predictor):
        return _model_predictive(model_or_predictor, seqs, template or DEFAULT_TEMPLATE,
                                 batch_size=batch_size, progress=progress, desc=desc)
    out = model_or_predictor(seqs)
    if isinstance(out, torch.Tensor):
        out = out.detach().cpu().numpy()
    out = np.asarray(out, dtype=np.float64)
    if out.shape != seqs.shape:
        raise InvalidInputError(
            f"the predictor returned shape {out.shape}, expected {seqs.shape} (P(next=1) at every prefix)."
        )
    finite = out[np.isfinite(out)]
    if finite.size and (finite.min() < 0 or finite.max() > 1):
        raise InvalidInputError("the predictor returned values outside [0, 1]; it must return P(next = 1).")
    return out, np.full(out.shape, np.nan)


def predict_with_next(model_or_predictor, seqs: np.ndarray, **kw) -> Tuple[np.ndarray, np.ndarray]:
    """Like :func:`predict_array` but with one more column: the predictive after the whole sequence."""
    ext = np.concatenate([seqs, np.zeros((seqs.shape[0], 1), dtype=np.int64)], axis=1)
    return predict_array(model_or_predictor, ext, **kw)


def predictive(model, sequences: Int[np.ndarray | Tensor, "n_seqs seq_len"], *,
               template: Optional[BernoulliTemplate] = None, include_next: bool = False,
               return_mass: bool = False, batch_size: int = 8, progress: Optional[bool] = None
               ) -> Float[Tensor, "n_seqs cols"] | Tuple[Float[Tensor, "n_seqs cols"], Float[Tensor, "n_seqs cols"]]:
    """P(next symbol = 1 | prefix) at every prefix of every sequence, from one forward pass each.

    Parameters
    ----------
    model : a TransformerLens model, or a predictor callable (see the module docstring).
    sequences : ``[n_seq, seq_len]`` of 0/1 (list of lists, array or tensor; equal lengths).
    template : how sequences become prompts (default :data:`DEFAULT_TEMPLATE`, ``"Sequence: 0 1 …"``).
    include_next : add a last column, the predictive after the whole sequence (for sampling).
    return_mass : also return the raw probability mass of the two symbol tokens (NaN for callables).

    Returns
    -------
    ``Tensor [n_seq, seq_len]`` (float64, CPU): column t is P(x_{t+1} = 1 | x_1 … x_t), column 0 the
    empty prefix (given only the template's preamble); with ``return_mass`` a pair ``(p, mass)``.
    """
    seqs = _as_sequences(sequences)
    fn = predict_with_next if include_next else predict_array
    p, mass = fn(model, seqs, template=template, batch_size=batch_size, progress=progress)
    p, mass = torch.from_numpy(p), torch.from_numpy(mass)
    return (p, mass) if return_mass else p


def prob_of(p1: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(observed symbol) from P(symbol = 1)."""
    return np.where(x == 1, p1, 1.0 - p1)


# ----------------------------------------------------------------------------- K-symbol predictive

def as_symbol_sequences(sequences, n_symbols: int, *, name: str = "sequences") -> np.ndarray:
    """A validated int64 array ``[n_seq, L]`` with values in 0 … n_symbols − 1."""
    if isinstance(sequences, torch.Tensor):
        sequences = sequences.detach().cpu().numpy()
    arr = np.asarray(sequences) if isinstance(sequences, np.ndarray) else None
    if arr is None:
        seqs = list(sequences)
        if not seqs or len({len(s) for s in seqs}) != 1:
            raise InvalidInputError(f"{name} must be a non-empty list of equal-length symbol sequences.")
        arr = np.asarray(seqs)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InvalidInputError(f"{name} must be a non-empty 2-D [n_seq, seq_len] array, got shape {arr.shape}.")
    if arr.dtype.kind == "f" and (not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))):
        raise InvalidInputError(f"{name} must hold integer symbols 0 … {n_symbols - 1}; found non-integers.")
    if arr.dtype.kind not in "iubf":
        raise InvalidInputError(f"{name} must hold integer symbols, got dtype {arr.dtype}.")
    arr = arr.astype(np.int64)
    if arr.min() < 0 or arr.max() >= n_symbols:
        raise InvalidInputError(
            f"{name} must hold symbols 0 … {n_symbols - 1}; found values in [{arr.min()}, {arr.max()}].")
    return arr


def _categorical_layouts(model, seqs: np.ndarray, template: CategoricalTemplate):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise InvalidInputError("the model has no tokenizer; attach one (model.set_tokenizer(...)).")
    k = template.n_symbols
    _, _, probe = symbol_layout(tok, template, list(range(k)) * 2)
    ids = [int(probe[s]) for s in range(k)]
    if len(set(ids)) != k:
        raise TokenizationError(f"symbols {template.symbols!r} do not map to {k} distinct tokens; choose other symbols.")
    for t in (0, 1):  # the context a symbol is read after must not depend on which symbol comes
        contexts = set()
        for s in range(k):
            tids, positions, _ = symbol_layout(tok, template, [0] * t + [s])
            contexts.add(tuple(tids[: positions[t]]))
        if len(contexts) != 1:
            raise TokenizationError(
                f"the symbols {template.symbols!r} do not all tokenize the same way after the separator "
                f"{template.separator!r} (some merge with it, some do not), so the position at which the "
                "predictive is read would depend on the symbol that follows; choose symbols that tokenize "
                "alike (e.g. all digits for a tokenizer that splits digits).")
    texts, layouts = [], []
    for seq in seqs:
        tids, positions, sym = symbol_layout(tok, template, seq)
        if any(sym.get(s, ids[s]) != ids[s] for s in range(k)):
            raise TokenizationError("symbol tokens differ between sequences; use a template with a separator.")
        texts.append(template.render(seq))
        layouts.append((tids, positions))
    return texts, layouts, ids


def _model_symbol_predictive(model, seqs: np.ndarray, template: CategoricalTemplate, *, batch_size: int,
                             progress: Optional[bool], desc: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(probs [n, L, K], mass [n, L])``: softmax over the K symbol tokens' logits, and their raw mass."""
    texts, layouts, symbols = _categorical_layouts(model, seqs, template)
    n, L = seqs.shape
    probs = np.full((n, L, len(symbols)), np.nan)
    mass = np.full((n, L), np.nan)
    for i, valid, lg, lse in _symbol_logits(model, texts, layouts, symbols, batch_size=batch_size,
                                            progress=progress, desc=desc):
        probs[i, valid] = torch.softmax(lg, dim=-1).numpy()
        mass[i, valid] = torch.exp(torch.logsumexp(lg, dim=-1) - lse).numpy()
    return probs, mass


def symbol_predictive(model_or_predictor, sequences, *, n_symbols: Optional[int] = None,
                      template: Optional[CategoricalTemplate] = None, include_next: bool = False,
                      batch_size: int = 8, progress: Optional[bool] = None,
                      desc: str = "symbol predictive") -> Tuple[np.ndarray, np.ndarray]:
    """``(probs, mass)``: the predictive over K symbols at every prefix, ``probs`` ``[n_seq, L, K]``.

    ``probs[i, t]`` is the distribution of x_{t+1} given x_1 … x_t (row 0: given the preamble only).
    A model's distribution is its softmax over the K symbol tokens (renormalized; ``mass`` is their
    raw probability under the full-vocabulary softmax); a *sequence predictor* is a callable mapping
    an int array ``[b, L]`` to ``[b, L, K]`` (``mass`` NaN), or for K = 2 to ``[b, L]`` of P(next = 1)
    (the binary predictors of :func:`gap` and :func:`permutation_average`). ``include_next`` adds the predictive
    after the whole sequence as column L. K is ``template.n_symbols`` for a model (default
    ``CategoricalTemplate.digits(n_symbols)``) and ``n_symbols`` for a predictor.
    """
    from .._validate import check_int, check_positive_int

    batch_size = check_positive_int(batch_size, "batch_size")
    if template is None:
        template = CategoricalTemplate.digits(2 if n_symbols is None else n_symbols)
    elif not isinstance(template, CategoricalTemplate):
        raise InvalidInputError(f"template must be a CategoricalTemplate, got {type(template).__name__}.")
    k = template.n_symbols if n_symbols is None else check_int(n_symbols, "n_symbols", min=2)
    if is_model(model_or_predictor) and k != template.n_symbols:
        raise InvalidInputError(f"n_symbols={k} but the template has {template.n_symbols} symbols; pass one of them.")
    seqs = as_symbol_sequences(sequences, k)
    if include_next:
        seqs = np.concatenate([seqs, np.zeros((seqs.shape[0], 1), dtype=np.int64)], axis=1)
    if is_model(model_or_predictor):
        return _model_symbol_predictive(model_or_predictor, seqs, template, batch_size=batch_size,
                                        progress=progress, desc=desc)
    if not callable(model_or_predictor):
        raise InvalidInputError(
            f"expected a TransformerLens model or a sequence predictor (int [b, L] -> [b, L, K]), got "
            f"{type(model_or_predictor).__name__}.")
    out = model_or_predictor(seqs)
    if isinstance(out, torch.Tensor):
        out = out.detach().cpu().numpy()
    out = np.asarray(out, dtype=np.float64)
    if k == 2 and out.shape == seqs.shape:  # a binary predictor of P(next = 1), as bl.martingale's others take
        out = np.stack([1.0 - out, out], axis=-1)
    if out.shape != seqs.shape + (k,):
        raise InvalidInputError(f"the predictor returned shape {out.shape}, expected {seqs.shape + (k,)}.")
    fin = out[np.isfinite(out).all(-1)]
    if fin.size and (fin.min() < 0 or np.abs(fin.sum(-1) - 1).max() > 1e-9):
        raise InvalidInputError("the predictor's rows must be probability distributions (>= 0, summing to 1).")
    return out, np.full(seqs.shape, np.nan)
