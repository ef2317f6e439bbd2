"""Regressions from mixture weights to a proxy metric, as `curate fit --model` names them.

    auto       (default) the one of quadratic, loglinear and gp with the smallest cross-validated
               error on these runs (each fitted without the runs it predicts)
    quadratic  Scheffe's quadratic mixture model, y = sum b_i w_i + sum b_ij w_i w_j,
               ridge-regularised (alpha by leave-one-out): the smallest model whose optimum
               can lie inside the simplex; it needs 1 + k(k+1)/2 runs (7 for 3 cells, 37 for 8)
    gp         a Gaussian process (constant x RBF with a length per cell, plus noise), its
               hyperparameters by maximum likelihood from seeded restarts
    loglinear  olmix's and the data mixing laws' y = c + exp(b + sum t_i w_i) (robust least squares)
    linear     y = b + sum t_i w_i: optima only at the caps' corners; a baseline
    lightgbm   RegMix's gradient-boosted trees (the optional `lightgbm` package)

Every model is deterministic for its seed. `uncertainty` is the spread of the prediction
over refits on bootstrap resamples of the runs (the GP: its posterior standard deviation).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import optimize, stats

from pipeline.errors import UsageError

MODELS = ("quadratic", "gp", "loglinear", "linear", "lightgbm")
AUTO = ("quadratic", "loglinear", "gp")
BOOTSTRAP = 40


def min_runs(model: str, k: int) -> int:
    """The fewest runs a model fits over k weight columns."""
    return {"quadratic": 1 + k * (k + 1) // 2, "linear": k + 2, "loglinear": k + 3}.get(model, max(8, k + 2))


class Surrogate:
    def __init__(self, model: str, seed: int = 0):
        if model not in MODELS:
            raise UsageError(f"--model {model!r}: choose one of {', '.join(MODELS)}")
        self.model, self.seed = model, seed

    # ---------------------------------------------------------------- fitting

    def fit(self, X: np.ndarray, y: np.ndarray) -> Surrogate:
        self.mu, self.sd = float(y.mean()), float(y.std() or 1.0)
        self._fn = self._fit(X, (y - self.mu) / self.sd)
        self._X, self._y = X, y
        return self

    def _fit(self, X: np.ndarray, z: np.ndarray):
        m = self.model
        if m in ("quadratic", "linear"):
            from sklearn.linear_model import RidgeCV

            F = features(X, m == "quadratic")
            r = RidgeCV(alphas=np.logspace(-8, 2, 41)).fit(F, z)
            return lambda Xn: r.predict(features(Xn, m == "quadratic"))
        if m == "loglinear":
            return _loglinear(X, z)
        if m == "gp":
            from sklearn.gaussian_process import GaussianProcessRegressor
            from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

            k = X.shape[1]
            kernel = ConstantKernel(1.0, (1e-2, 1e2)) * RBF(np.full(k, 0.5), (1e-2, 1e2)) + WhiteKernel(0.1, (1e-6, 1.0))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gp = GaussianProcessRegressor(kernel, n_restarts_optimizer=4, random_state=self.seed).fit(X, z)
            self._gp = gp
            return gp.predict
        try:
            import lightgbm
        except ImportError:
            raise UsageError("--model lightgbm needs the lightgbm package: pip install 'curate[lightgbm]'") from None
        reg = lightgbm.LGBMRegressor(n_estimators=200, learning_rate=0.05, num_leaves=7, min_child_samples=3,
                                     subsample=1.0, random_state=self.seed, deterministic=True, n_jobs=1, verbose=-1)
        reg.fit(X, z)
        return reg.predict

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self._fn(np.atleast_2d(X)) * self.sd + self.mu

    def uncertainty(self, x: np.ndarray) -> float:
        """Standard deviation of the prediction at x."""
        if self.model == "gp":
            _, s = self._gp.predict(np.atleast_2d(x), return_std=True)
            return float(s[0] * self.sd)
        rng = np.random.default_rng(self.seed)
        n = len(self._y)
        preds = []
        for _ in range(BOOTSTRAP):
            idx = rng.integers(0, n, n)
            if len(set(idx.tolist())) < 3:
                continue
            preds.append(float(Surrogate(self.model, self.seed).fit(self._X[idx], self._y[idx]).predict(x)[0]))
        return float(np.std(preds)) if preds else float("nan")


def features(X: np.ndarray, quadratic: bool) -> np.ndarray:
    """The weights, and with `quadratic` every product of two (Scheffe's terms)."""
    X = np.atleast_2d(X)
    if not quadratic:
        return X
    i, j = np.triu_indices(X.shape[1], 1)
    return np.hstack([X, X[:, i] * X[:, j]])


def _loglinear(X: np.ndarray, z: np.ndarray):
    """z = c + exp(b + X t), fitted by soft-L1 least squares from a seeded log-linear start."""
    k = X.shape[1]

    def f(p, Xn):
        return p[0] + np.exp(np.clip(p[1] + Xn @ p[2:], -50, 50))

    best = None
    for c0 in (z.min() - 1.0, z.min() - 0.1 * (np.ptp(z) or 1), z.min() - 3.0):
        t0 = np.linalg.lstsq(np.hstack([np.ones((len(z), 1)), X]), np.log(np.maximum(z - c0, 1e-9)), rcond=None)[0]
        p0 = np.concatenate([[c0], t0[:1], t0[1:]])
        r = optimize.least_squares(lambda p: f(p, X) - z, p0, loss="soft_l1", f_scale=0.5, max_nfev=2000 * (k + 2))
        if best is None or r.cost < best.cost:
            best = r
    p = best.x
    return lambda Xn: f(p, np.atleast_2d(Xn))


def cross_validated(model: str, X: np.ndarray, y: np.ndarray, seed: int = 0, folds: int = 8) -> tuple[np.ndarray, float]:
    """Out-of-fold predictions (each run predicted by a fit without it) and their Spearman
    rank correlation with the observed metric."""
    n = len(y)
    order = np.random.default_rng(seed).permutation(n)
    pred = np.empty(n)
    for f in range(min(folds, n)):
        test = order[f::min(folds, n)]
        train = np.setdiff1d(order, test)
        pred[test] = Surrogate(model, seed).fit(X[train], y[train]).predict(X[test])
    rho = stats.spearmanr(pred, y).statistic if np.ptp(y) > 0 else float("nan")
    return pred, float(rho)


def select(X: np.ndarray, y: np.ndarray, seed: int = 0) -> tuple[str, dict[str, dict]]:
    """`auto`: the model of AUTO (that these runs can fit) with the smallest out-of-fold
    RMSE; returns it and every candidate's out-of-fold predictions, RMSE and Spearman."""
    table = {}
    for m in AUTO:
        if len(y) >= min_runs(m, X.shape[1]):
            pred, rho = cross_validated(m, X, y, seed)
            table[m] = {"oof": pred, "rmse": float(np.sqrt(np.mean((pred - y) ** 2))), "spearman": rho}
    if not table:
        raise UsageError(f"{len(y)} runs are too few for any model over {X.shape[1]} weights; run more variants")
    return min(table, key=lambda m: (table[m]["rmse"], AUTO.index(m))), table
