"""A small numpy classifier (logistic regression or a one-hidden-layer MLP) trained with Adam.

Training state is immutable per step: each step returns a new ``TrainState``, so a signal handler
that checkpoints between steps always sees a consistent (step, params, optimizer, rng) tuple.
The loss is plain log-loss (calibrated probabilities); the metric applies the miss/review costs
through its threshold, so costs are counted once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

Arrays = Mapping[str, np.ndarray]


class Diverged(FloatingPointError):
    """The loss or the parameters stopped being finite."""


@dataclass(frozen=True)
class Hyper:
    lr: float
    hidden: int
    l2: float
    batch_size: int
    pos_weight: float

    @classmethod
    def from_params(cls, params: Mapping, pos_weight: float) -> Hyper:
        return cls(float(params["lr"]), int(params.get("hidden", 0)), float(params.get("l2", 0.0)), int(params.get("batch_size", 64)), pos_weight)


@dataclass(frozen=True)
class TrainState:
    step: int
    params: dict
    opt: dict
    rng_state: dict


def init_state(n_features: int, hyper: Hyper, seed: int) -> TrainState:
    rng = np.random.Generator(np.random.PCG64(seed))
    if hyper.hidden > 0:
        params = {
            "w1": rng.normal(0.0, 1.0 / np.sqrt(n_features), (n_features, hyper.hidden)),
            "b1": np.zeros(hyper.hidden),
            "w2": rng.normal(0.0, 1.0 / np.sqrt(hyper.hidden), (hyper.hidden,)),
            "b2": np.zeros(1),
        }
    else:
        params = {"w2": np.zeros(n_features), "b2": np.zeros(1)}
    opt = {f"m_{k}": np.zeros_like(v) for k, v in params.items()} | {f"v_{k}": np.zeros_like(v) for k, v in params.items()}
    return TrainState(0, params, opt, rng.bit_generator.state)


def logits(params: Arrays, x: np.ndarray) -> np.ndarray:
    if "w1" in params:
        h = np.maximum(x @ params["w1"] + params["b1"], 0.0)
        return h @ params["w2"] + params["b2"][0]
    return x @ params["w2"] + params["b2"][0]


def predict_proba(params: Arrays, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(logits(params, x), -60, 60)))


def train_step(state: TrainState, x: np.ndarray, y: np.ndarray, hyper: Hyper) -> TrainState:
    """One Adam step on a minibatch drawn from the state's own RNG."""
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = state.rng_state
    idx = rng.integers(0, x.shape[0], size=min(hyper.batch_size, x.shape[0]))
    xb, yb = x[idx], y[idx].astype(np.float64)
    p = state.params
    weight = np.where(yb > 0, hyper.pos_weight, 1.0)
    if "w1" in p:
        pre = xb @ p["w1"] + p["b1"]
        h = np.maximum(pre, 0.0)
        z = h @ p["w2"] + p["b2"][0]
    else:
        z = xb @ p["w2"] + p["b2"][0]
    prob = 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))
    loss = float(np.mean(weight * (np.logaddexp(0.0, z) - yb * z)))
    if not np.isfinite(loss):
        raise Diverged(f"loss is {loss} at step {state.step + 1}")
    dz = weight * (prob - yb) / xb.shape[0]
    grads = {"w2": (h.T @ dz if "w1" in p else xb.T @ dz) + hyper.l2 * p["w2"], "b2": np.array([dz.sum()])}
    if "w1" in p:
        dh = np.outer(dz, p["w2"]) * (pre > 0)
        grads["w1"] = xb.T @ dh + hyper.l2 * p["w1"]
        grads["b1"] = dh.sum(axis=0)
    t = state.step + 1
    b1, b2, eps = 0.9, 0.999, 1e-8
    params, opt = {}, {}
    for k, g in grads.items():
        m = b1 * state.opt[f"m_{k}"] + (1 - b1) * g
        v = b2 * state.opt[f"v_{k}"] + (1 - b2) * g * g
        params[k] = p[k] - hyper.lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        opt[f"m_{k}"], opt[f"v_{k}"] = m, v
    if not all(np.all(np.isfinite(v)) for v in params.values()):
        raise Diverged(f"parameters are not finite at step {t}")
    return TrainState(t, params, opt, rng.bit_generator.state)
