"""Calibrating functions f_theta: [0, 1] -> [0, 1] (binary) or the simplex -> the simplex (K classes).

A :class:`Family` is a finite, ordered grid of calibrating functions, the Theta of paper 001 (the E
of paper 000). The kernels evaluate a family by its integer ``code`` and its parameter arrays; the
numpy :func:`evaluate` here is the readable reference the kernels are tested against.

Families (paper and equation):

============  ======================================================  ===================
name          f_theta                                                 source
============  ======================================================  ===================
quadratic     p + eps p (1 - p),            eps in [-1, 1]              paper 000, eq. (1)
cubic         p + a p (p - b)(p - 1),       (a, b) in [0, 1]^2          paper 000, eq. (3)
cox           p^beta / (p^beta + (1-p)^beta),  beta > 0                 paper 000, eq. (4)
cox2          p^beta e^alpha / (p^beta e^alpha + (1-p)^beta)            paper 000, eq. (5)
cox2, K       p_y^beta e^{alpha(y)} / sum_y' p_y'^beta e^{alpha(y')}     paper 001, eq. (1)
============  ======================================================  ===================

Default grids (docs/ARCHITECTURE.md §4): binary ``cox2`` is beta in {1, 0.5, 2} x alpha in {0, +1, -1} on class 1,
9 distinct functions with the identity first; for K >= 3 classes it is beta in {1, 0.5, 2} x
alpha in {0} u {+e_k} u {-e_k}, 3(2K + 1) functions. (The K = 2 instance of the multiclass grid has
15 slots of which 6 repeat: +e_0 is -e_1 after the softmax's shift invariance; the binary grid keeps
each function once, the Brier compatibility mode keeps the package's 15 slots.)

Example
-------
>>> import numpy as np
>>> fam = binary_family("cox2")
>>> fam.size, fam.identity_index
(9, 0)
>>> np.round(evaluate(fam, np.array([0.2]))[0, :3], 4)
array([0.2   , 0.3333, 0.0588])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from calpipe import config

#: Kernel codes of the binary families (the kernels branch on these).
QUADRATIC, CUBIC, COX = 0, 1, 2
BINARY_FAMILIES = ("quadratic", "cubic", "cox", "cox2")
MULTICLASS_FAMILIES = ("cox", "cox2")


@dataclass(frozen=True)
class Family:
    """An ordered grid of calibrating functions.

    Attributes
    ----------
    name : str
        ``quadratic``, ``cubic``, ``cox`` or ``cox2``.
    n_classes : int
        2 for binary families (functions of p = P(y = 1)); K >= 2 for multiclass Cox families.
    params : ndarray, shape (n_functions, 2)
        Binary: (eps, 0) quadratic, (a, b) cubic, (alpha, beta) Cox (alpha = 0 for ``cox``).
        Multiclass: (0, beta) per function; the shifts are in ``alphas``.
    alphas : ndarray, shape (n_functions, K)
        Multiclass only (empty for binary): alpha(y) of paper 001 eq. (1).
    """

    name: str
    n_classes: int
    params: np.ndarray
    alphas: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    @property
    def size(self) -> int:
        return int(self.params.shape[0])

    @property
    def code(self) -> int:
        return {"quadratic": QUADRATIC, "cubic": CUBIC, "cox": COX, "cox2": COX}[self.name]

    @property
    def multiclass(self) -> bool:
        return self.alphas.shape[0] > 0

    @property
    def betas(self) -> np.ndarray:
        return self.params[:, 1]

    @property
    def identity_index(self) -> int | None:
        """Index of the first function that is the identity on a fine grid, or None.

        Memoised by the family's content (families are rebuilt from the parameters at every
        call of a calibrator, and this probe was ~0.1 ms of a 2,000-event ``protect``)."""
        return _identity_index(
            self.name, self.n_classes,
            self.params.dtype.str, self.params.shape, self.params.tobytes(),
            self.alphas.dtype.str, self.alphas.shape, self.alphas.tobytes(),
        )  # fmt: skip

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "n_classes": self.n_classes,
            "params": self.params.tolist(),
            "alphas": self.alphas.tolist(),
        }


def _find_identity(family: Family) -> int | None:
    """The first function of ``family`` that is the identity on the probe points, or None."""
    q = _probe_points(family.n_classes)
    f = evaluate(family, q if family.multiclass else q[:, 1])
    base = q if family.multiclass else q[:, 1][:, None]
    if family.multiclass:
        err = np.abs(f - base[:, None, :]).max(axis=(0, 2))
    else:
        err = np.abs(f - base).max(axis=0)
    hits = np.flatnonzero(err <= config.FAMILY_DEDUP_TOL)
    return int(hits[0]) if hits.size else None


@lru_cache(maxsize=config.FAMILY_CACHE_SIZE)
def _identity_index(name, n_classes, p_dtype, p_shape, p_bytes, a_dtype, a_shape, a_bytes):
    """:attr:`Family.identity_index` of the family with these contents (its arrays as bytes)."""
    params = np.frombuffer(p_bytes, dtype=p_dtype).reshape(p_shape)
    alphas = np.frombuffer(a_bytes, dtype=a_dtype).reshape(a_shape)
    return _find_identity(Family(name, n_classes, params, alphas))


def _probe_points(k: int) -> np.ndarray:
    """Points of the open simplex on which two functions are compared (rows sum to 1)."""
    rng = np.random.default_rng(0)
    pts = rng.dirichlet(np.ones(k), size=64)
    if k == 2:
        p = np.linspace(0.01, 0.99, 99)
        pts = np.column_stack([1.0 - p, p])
    return pts


def binary_family(name: str = "cox2", params=None) -> Family:
    """Binary calibrating family ``name`` with the default grid, or the grid ``params``.

    ``params`` is a sequence of numbers for ``quadratic`` (eps) and ``cox`` (beta), of pairs for
    ``cubic`` (a, b) and ``cox2`` (alpha, beta). Parameter ranges are checked by the calibrator's
    constraint table (:mod:`calpipe.calibrators._params`), not here.
    """
    if name == "quadratic":
        eps = config.DEFAULT_QUADRATIC_EPS if params is None else params
        arr = np.column_stack([np.asarray(eps, float).ravel(), np.zeros(len(eps))])
    elif name == "cubic":
        ab = config.DEFAULT_CUBIC_AB if params is None else params
        arr = np.asarray(ab, float).reshape(-1, 2)
    elif name == "cox":
        betas = config.DEFAULT_COX_BETAS if params is None else params
        arr = np.column_stack([np.zeros(len(betas)), np.asarray(betas, float).ravel()])
    elif name == "cox2":
        if params is None:
            arr = np.array(
                [(a, b) for a in config.DEFAULT_COX_ALPHAS for b in config.DEFAULT_COX_BETAS],
                float,
            )
        else:
            arr = np.asarray(params, float).reshape(-1, 2)
    else:
        raise ValueError(f"unknown binary family {name!r}; expected one of {BINARY_FAMILIES}")
    return Family(name, 2, np.ascontiguousarray(arr, dtype=np.float64))


def multiclass_family(n_classes: int, name: str = "cox2", betas=None, alpha_shifts=None) -> Family:
    """Multiclass Cox family of paper 001 eq. (1) over K = ``n_classes`` classes.

    ``cox``: alpha = 0, beta in ``betas``. ``cox2``: alpha in {0} u {+a e_k, -a e_k : k, a} (for each
    shift a in ``alpha_shifts``, default {1}), crossed with ``betas``, alpha outer, in the order
    0, +e_0, -e_0, +e_1, -e_1, ... (the order of the reference package), so the identity is first.
    """
    if name not in MULTICLASS_FAMILIES:
        raise ValueError(
            f"unknown multiclass family {name!r}; expected one of {MULTICLASS_FAMILIES}"
        )
    betas = np.asarray(config.DEFAULT_COX_BETAS if betas is None else betas, float).ravel()
    rows = [np.zeros(n_classes)]
    if name == "cox2":
        shifts = [1.0] if alpha_shifts is None else [float(a) for a in alpha_shifts]
        for k in range(n_classes):
            for a in shifts:
                for sign in (1.0, -1.0):
                    row = np.zeros(n_classes)
                    row[k] = sign * a
                    rows.append(row)
    alphas = np.array([r for r in rows for _ in betas], float)
    params = np.array([(0.0, b) for _ in rows for b in betas], float)
    return Family(name, n_classes, params, np.ascontiguousarray(alphas))


def package_grid(n_classes: int) -> Family:
    """The reference package's grid (``protected-classification`` 0.1.5, ``generate_protected_params``).

    alpha in {0, +e_0, -e_0, +e_1, -e_1, ...} x beta in {1, 0.5, 2}: 3(2K + 1) slots, 15 for binary,
    where the functions with alpha = +e_0 and -e_1 (and -e_0, +e_1) coincide and so stand twice.
    """
    return multiclass_family(n_classes, "cox2")


def evaluate(family: Family, p: np.ndarray) -> np.ndarray:
    """f_theta(p) for every function of ``family``: the slow, obvious numpy version.

    Binary: ``p`` of shape (n,), result (n, n_functions). Multiclass: ``p`` of shape (n, K),
    result (n, n_functions, K).
    """
    p = np.asarray(p, dtype=np.float64)
    if family.multiclass:
        beta = family.params[:, 1]
        num = p[:, None, :] ** beta[None, :, None] * np.exp(family.alphas)[None, :, :]
        return num / num.sum(axis=2, keepdims=True)
    a, b = family.params[:, 0][None, :], family.params[:, 1][None, :]
    q = p[:, None]
    if family.name == "quadratic":
        return q + a * q * (1.0 - q)
    if family.name == "cubic":
        return q + a * q * (q - b) * (q - 1.0)
    num = q**b * np.exp(a)
    return num / (num + (1.0 - q) ** b)
