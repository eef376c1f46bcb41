"""Wind-tunnel tasks: sequence generators whose Bayes-optimal predictive is known exactly.

Two tasks from Paper A Part I ("The Bayesian Geometry of Transformer Attention", arXiv 2512.22471;
METHODS.md §11). Each task owns a word-level vocabulary (tokens are whitespace-separated words, so
a sequence renders as a plain string such as ``"x3 y7 x1 y2"`` that any TransformerLens model with
the task's tokenizer, and the geometry suite, can take) and a seeded, batched generator that
returns token ids, the *target positions* (where the model's next-token distribution is scored)
and the exact Bayes predictive at each target.

**Bijection elimination** (:class:`BijectionTask`). Each sequence draws a fresh uniformly random
bijection π of V symbols and a random order of the V inputs, and shows the pairs
``x_{a1} y_{π(a1)} x_{a2} y_{π(a2)} …``. Before y_k is revealed, k − 1 outputs have been seen and
eliminated, so the Bayes predictive of y_k is uniform over the V − k + 1 unseen outputs and its
entropy is exactly ``log2(V − k + 1)`` bits (k = 1 … V; the last answer is determined, 0 bits).
The scored position is the one holding x_k (its next token is y_k).

**HMM filtering** (:class:`HMMTask`). Each sequence draws an HMM with S hidden states and V
symbols, writes its parameters into the prompt, then K observations from it. Tokenization of the
parameters (our decision; the paper does not publish one): every row of the transition matrix T
(S × S) and of the emission matrix E (S × V) is drawn from a symmetric Dirichlet(α) and quantized
to integer multiples of 1/Q by the largest-remainder method (so each row still sums to exactly 1);
the entry j/Q is the word ``p{j}``. The prompt is::

    T  p.. (S rows of S words)  E  p.. (S rows of V words)  O  o.. o..  (K observation words)

The initial state is uniform over the S states (documented, not written in the prompt). The
generated observations come from the *quantized* HMM, so the forward algorithm on the written
parameters is the exact Bayes predictive: with the filtered posterior α_t(s) = P(h_t = s | o_1:t),
``P(o_{t+1} = o | o_1:t) = Σ_s' (Σ_s α_t(s) T[s, s']) E[s', o]`` (and ``P(o_1) = Σ_s E[s, o] / S``).
The scored positions are ``O`` (predicting o_1) and o_1 … o_{K−1}. We score the next-*symbol*
predictive (what a causal language model outputs); the paper's state-posterior variant needs a
probe and is not offered.

Example
-------
>>> from bayes_lens.windtunnel import BijectionTask
>>> task = BijectionTask(V=4)
>>> batch = task.sample(2, seed=0)
>>> batch.tokens.shape
(2, 8)
>>> np.allclose(batch.bayes_entropy_bits[0], np.log2([4, 3, 2, 1]))   # log2(V - k + 1) before y_k
True
>>> task.to_text(batch.tokens)[0].split()[0].startswith("x")
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

from .._validate import check_int, check_seed
from ..errors import InvalidInputError
from ..metrics.stats import entropy_bits

__all__ = ["Batch", "BijectionTask", "HMMTask", "make_task", "task_from_dict", "hmm_forward", "SPECIAL_TOKENS"]

# Every task vocabulary starts with these; the tokenizer's pad / unk / bos tokens.
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>")


@dataclass(frozen=True, eq=False)
class Batch:
    """A batch of generated sequences with their exact Bayes predictives.

    Attributes
    ----------
    tokens: ``[n, seq_len]`` int64 token ids.
    target_positions: ``[K]`` positions whose next-token distribution is scored (same for every row).
    answer_ids: ``[A]`` the token ids the Bayes predictive is spread over (the task's answer symbols).
    bayes_probs: ``[n, K, A]`` float64 exact predictive over ``answer_ids`` at each target.
    bayes_entropy_bits: ``[n, K]`` float64 entropy of ``bayes_probs`` in bits.
    """

    tokens: np.ndarray
    target_positions: np.ndarray
    answer_ids: np.ndarray
    bayes_probs: np.ndarray
    bayes_entropy_bits: np.ndarray

    @property
    def targets(self) -> np.ndarray:
        """``[n, K]`` the token that actually follows each target position."""
        return self.tokens[:, self.target_positions + 1]


def _entropy_bits(p: np.ndarray) -> np.ndarray:
    return entropy_bits(p)


def _check_int(name: str, value, minimum: int, hint: str) -> int:
    try:
        return check_int(value, name, min=minimum)
    except InvalidInputError as err:
        raise InvalidInputError(f"{str(err).rstrip('.')}: {hint}") from None


def _check_n_seed(n, seed) -> None:
    _check_int("n_seqs", n, 1, "ask for at least one sequence.")
    check_seed(seed)


class _Task:
    name: str
    vocab: List[str]

    @property
    def token_to_id(self) -> Dict[str, int]:
        return {w: i for i, w in enumerate(self.vocab)}

    @property
    def d_vocab(self) -> int:
        return len(self.vocab)

    def to_text(self, tokens) -> List[str]:
        """Render token ids ``[n, L]`` (or one ``[L]`` row) as whitespace-separated strings."""
        arr = np.asarray(tokens)
        if arr.ndim == 1:
            arr = arr[None]
        return [" ".join(self.vocab[int(t)] for t in row) for row in arr]

    def from_text(self, texts: Sequence[str]) -> np.ndarray:
        """Parse strings of task words back into ``[n, L]`` token ids (all rows the same length)."""
        lookup = self.token_to_id
        rows = []
        for text in texts:
            try:
                rows.append([lookup[w] for w in text.split()])
            except KeyError as err:
                raise InvalidInputError(f"{err.args[0]!r} is not a word of the {self.name} task's vocabulary.") from None
        if len({len(r) for r in rows}) > 1:
            raise InvalidInputError("all texts must have the same number of words.")
        return np.asarray(rows, dtype=np.int64)

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.to_dict().items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "task")
        return f"{type(self).__name__}({args})"


class BijectionTask(_Task):
    """Bijection elimination over ``V`` symbols (Paper I used V = 20).

    Words: ``x1 … xV`` (inputs) and ``y1 … yV`` (outputs). Sequence length 2V; targets are the
    x positions; Bayes entropy before y_k is ``log2(V − k + 1)``.
    """

    name = "bijection"

    def __init__(self, V: int = 10):
        self.V = _check_int("V", V, 2, "bijection elimination needs at least 2 symbols (V = 1 has nothing to infer).")
        self.vocab = list(SPECIAL_TOKENS) + [f"x{i}" for i in range(1, self.V + 1)] + [f"y{i}" for i in range(1, self.V + 1)]

    @property
    def seq_len(self) -> int:
        return 2 * self.V

    @property
    def n_targets(self) -> int:
        return self.V

    def _x_id(self, i):
        return len(SPECIAL_TOKENS) + i

    def _y_id(self, i):
        return len(SPECIAL_TOKENS) + self.V + i

    def bayes_entropy_bits(self) -> np.ndarray:
        """``[V]`` the exact Bayes entropy log2(V − k + 1) before y_k, k = 1 … V."""
        return np.log2(self.V - np.arange(self.V, dtype=np.float64))

    def sample(self, n_seqs: int, *, seed: int) -> Batch:
        """``n_seqs`` sequences, each with its own random bijection and input order (seeded)."""
        n = n_seqs
        _check_n_seed(n, seed)
        rng = np.random.default_rng(seed)
        order = np.argsort(rng.random((n, self.V)), axis=1)        # which input comes k-th
        perm = np.argsort(rng.random((n, self.V)), axis=1)         # the bijection π
        outputs = np.take_along_axis(perm, order, axis=1)         # y_k = π(x_k)
        tokens = np.empty((n, 2 * self.V), dtype=np.int64)
        tokens[:, 0::2] = self._x_id(order)
        tokens[:, 1::2] = self._y_id(outputs)
        # Bayes predictive over y1..yV: uniform over outputs not yet revealed
        seen = np.zeros((n, self.V, self.V), dtype=bool)
        rows = np.arange(n)
        for k in range(1, self.V):
            seen[:, k] = seen[:, k - 1]
            seen[rows, k, outputs[:, k - 1]] = True
        probs = (~seen).astype(np.float64)
        probs /= probs.sum(-1, keepdims=True)
        return Batch(
            tokens=tokens,
            target_positions=np.arange(0, 2 * self.V, 2),
            answer_ids=self._y_id(np.arange(self.V)),
            bayes_probs=probs,
            bayes_entropy_bits=_entropy_bits(probs),
        )

    def to_dict(self) -> dict:
        return {"task": self.name, "V": self.V}


def _quantize_rows(p: np.ndarray, Q: int) -> np.ndarray:
    """Largest-remainder rounding of probability rows to integer counts summing to ``Q``."""
    scaled = p * Q
    counts = np.floor(scaled).astype(np.int64)
    short = Q - counts.sum(-1)
    frac = scaled - counts
    # rank the remainders (ties broken by index) and give one unit to the `short` largest
    order = np.argsort(-frac, axis=-1, kind="stable")
    ranks = np.argsort(order, axis=-1, kind="stable")
    counts += (ranks < short[..., None]).astype(np.int64)
    return counts


def hmm_forward(T: np.ndarray, E: np.ndarray, obs: np.ndarray, initial: np.ndarray | None = None) -> np.ndarray:
    """Exact next-symbol predictive of an HMM by the forward algorithm (float64, batched).

    Parameters
    ----------
    T: ``[n, S, S]`` transition matrices (rows sum to 1). E: ``[n, S, V]`` emission matrices.
    obs: ``[n, K]`` observed symbols (0-based). initial: ``[n, S]`` or ``[S]``; uniform if omitted.

    Returns
    -------
    ``[n, K, V]``: row t is P(o_{t+1} = · | o_1 … o_t) (row 0 is the marginal of o_1).
    """
    T = np.asarray(T, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    obs = np.asarray(obs, dtype=np.int64)
    n, S, _ = T.shape
    K = obs.shape[1]
    belief = np.full((n, S), 1.0 / S) if initial is None else np.broadcast_to(np.asarray(initial, float), (n, S)).copy()
    rows = np.arange(n)
    out = np.empty((n, K, E.shape[2]))
    for t in range(K):
        out[:, t] = np.einsum("ns,nsv->nv", belief, E)            # predictive of o_{t+1}
        post = belief * E[rows, :, obs[:, t]]                       # filter on o_{t+1}
        post /= post.sum(-1, keepdims=True)
        belief = np.einsum("ns,nst->nt", post, T)                   # predict the next state
    return out


class HMMTask(_Task):
    """HMM filtering with the parameters in the prompt (Paper I: S = 5, V = 5, K = 20).

    Parameters
    ----------
    S: hidden states (≥ 2). V: observation symbols (≥ 2). K: observations per sequence (≥ 1).
    Q: quantization of probabilities (entries are multiples of 1/Q, words ``p0 … pQ``; ≥ 1).
    alpha: Dirichlet concentration of the random rows (< 1 gives peakier, more informative HMMs).
    """

    name = "hmm"

    def __init__(self, S: int = 5, V: int = 5, K: int = 20, Q: int = 8, alpha: float = 0.5):
        self.S = _check_int("S", S, 2, "an HMM needs at least 2 hidden states (S = 1 is i.i.d. sampling).")
        self.V = _check_int("V", V, 2, "an HMM needs at least 2 observation symbols.")
        self.K = _check_int("K", K, 1, "ask for at least one observation per sequence.")
        self.Q = _check_int("Q", Q, 1, "probabilities are written as multiples of 1/Q.")
        try:
            self.alpha = float(alpha)
        except (TypeError, ValueError):
            raise InvalidInputError(f"alpha must be a positive number, got {alpha!r}.") from None
        if not np.isfinite(self.alpha) or self.alpha <= 0:
            raise InvalidInputError(f"alpha must be a positive number, got {alpha!r}.")
        self.vocab = (list(SPECIAL_TOKENS) + ["T", "E", "O"] + [f"p{j}" for j in range(self.Q + 1)]
                      + [f"o{i}" for i in range(1, self.V + 1)])

    @property
    def _p0(self) -> int:
        return len(SPECIAL_TOKENS) + 3

    @property
    def _o0(self) -> int:
        return self._p0 + self.Q + 1

    @property
    def prefix_len(self) -> int:
        """Tokens before the first observation: T, S·S, E, S·V, O."""
        return 3 + self.S * self.S + self.S * self.V

    @property
    def seq_len(self) -> int:
        return self.prefix_len + self.K

    @property
    def n_targets(self) -> int:
        return self.K

    def sample_parameters(self, n_seqs: int, *, seed: int):
        """``(T, E)`` quantized parameters ``[n_seqs, S, S]``, ``[n_seqs, S, V]`` as integer counts out of Q."""
        n = n_seqs
        _check_n_seed(n, seed)
        rng = np.random.default_rng(seed)
        T = _quantize_rows(rng.dirichlet(np.full(self.S, self.alpha), size=(n, self.S)), self.Q)
        E = _quantize_rows(rng.dirichlet(np.full(self.V, self.alpha), size=(n, self.S)), self.Q)
        return T, E, rng

    def sample(self, n_seqs: int, *, seed: int) -> Batch:
        """``n_seqs`` sequences, each with its own random quantized HMM (seeded)."""
        n = n_seqs
        Tc, Ec, rng = self.sample_parameters(n, seed=seed)
        T, E = Tc / self.Q, Ec / self.Q
        rows = np.arange(n)
        obs = np.empty((n, self.K), dtype=np.int64)
        state = rng.integers(0, self.S, size=n)
        for t in range(self.K):
            cdf = np.cumsum(E[rows, state], axis=-1)
            obs[:, t] = np.minimum((rng.random((n, 1)) > cdf).sum(-1), self.V - 1)
            cdf = np.cumsum(T[rows, state], axis=-1)
            state = np.minimum((rng.random((n, 1)) > cdf).sum(-1), self.S - 1)
        base = len(SPECIAL_TOKENS)
        tokens = np.concatenate([
            np.full((n, 1), base + 0), self._p0 + Tc.reshape(n, -1),
            np.full((n, 1), base + 1), self._p0 + Ec.reshape(n, -1),
            np.full((n, 1), base + 2), self._o0 + obs,
        ], axis=1).astype(np.int64)
        probs = hmm_forward(T, E, obs)
        return Batch(
            tokens=tokens,
            target_positions=np.arange(self.prefix_len - 1, self.seq_len - 1),
            answer_ids=self._o0 + np.arange(self.V),
            bayes_probs=probs,
            bayes_entropy_bits=_entropy_bits(probs),
        )

    def parse(self, tokens) -> tuple:
        """``(T, E, obs)`` read back from token ids ``[n, seq_len]`` (probabilities, 0-based symbols)."""
        arr = np.asarray(tokens, dtype=np.int64)
        n = arr.shape[0]
        s2, sv = self.S * self.S, self.S * self.V
        T = (arr[:, 1:1 + s2] - self._p0).reshape(n, self.S, self.S) / self.Q
        E = (arr[:, 2 + s2:2 + s2 + sv] - self._p0).reshape(n, self.S, self.V) / self.Q
        obs = arr[:, self.prefix_len:] - self._o0
        return T, E, obs

    def to_dict(self) -> dict:
        return {"task": self.name, "S": self.S, "V": self.V, "K": self.K, "Q": self.Q, "alpha": self.alpha}


_TASKS = {"bijection": BijectionTask, "hmm": HMMTask}


def make_task(name: str, **params) -> _Task:
    """A task by name: ``"bijection"`` (params ``V``) or ``"hmm"`` (``S, V, K, Q, alpha``)."""
    if isinstance(name, _Task):
        return name
    if name not in _TASKS:
        raise InvalidInputError(f"unknown wind-tunnel task {name!r}; expected one of {sorted(_TASKS)}.")
    try:
        return _TASKS[name](**params)
    except TypeError as err:
        raise InvalidInputError(f"bad parameters for the {name!r} task: {err}.") from None


def task_from_dict(d: dict) -> _Task:
    """Inverse of ``task.to_dict()``."""
    if not isinstance(d, dict) or "task" not in d:
        raise InvalidInputError(f"a task description must be a dict with a 'task' key, got {d!r}.")
    d = dict(d)
    return make_task(d.pop("task"), **d)
