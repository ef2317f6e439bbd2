"""Choosing mixture weights from proxy results: `curate sweep` writes variant mixture files
over the feasible weights (space.py, sweep.py), `curate fit` fits a surrogate from weights
to the user's proxy metrics and proposes the best feasible weights (surrogate.py, fit.py)."""
