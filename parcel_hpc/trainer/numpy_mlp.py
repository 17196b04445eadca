"""The built-in trainer: a small numpy classifier (logistic regression, or an MLP with one hidden
ReLU layer) trained with Adam on the pinned preprocessing's features. The reference implementation
of the trainer interface, and the model of the demo.

Params: ``lr``, ``hidden`` (0: logistic regression), ``l2``, ``batch_size``. The loss is plain
log-loss (calibrated probabilities); the metric applies the miss/review costs through its threshold,
so costs are counted once. Minibatches come from the trainer's own generator, saved with its state,
so a resumed trial continues bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from parcel_hpc.data.preprocessing import Preprocessor
from parcel_hpc.trainer.base import Diverged, Trainer, TrainerState
from parcel_hpc.trainer.data import TrainingData
from parcel_hpc.trainer.params import Param

_ADAM = (0.9, 0.999, 1e-8)  # beta1, beta2, epsilon


class NumpyMLP(Trainer):
    unit = "step"  # one Adam step on one minibatch
    parameters = {"lr": Param(float), "hidden": Param(int, default=0), "l2": Param(float, default=0.0), "batch_size": Param(int, default=64)}

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        self.lr = float(params["lr"])
        self.hidden = int(params.get("hidden", 0))
        self.l2 = float(params.get("l2", 0.0))
        self.batch_size = int(params.get("batch_size", 64))
        self.data = data
        self.preprocessing = data.preprocessing
        n_features = data.train.features.shape[1]
        self.rng = np.random.Generator(np.random.PCG64(seed))  # initial weights, then minibatches
        if self.hidden > 0:
            self.weights = {
                "w1": self.rng.normal(0.0, 1.0 / np.sqrt(n_features), (n_features, self.hidden)),
                "b1": np.zeros(self.hidden),
                "w2": self.rng.normal(0.0, 1.0 / np.sqrt(self.hidden), (self.hidden,)),
                "b2": np.zeros(1),
            }
        else:
            self.weights = {"w2": np.zeros(n_features), "b2": np.zeros(1)}
        self.moments = {f"{m}_{k}": np.zeros_like(v) for m in ("m", "v") for k, v in self.weights.items()}
        self.steps_done = 0

    def step(self) -> Mapping[str, float]:
        x, y = self.data.train.features, self.data.train.labels
        idx = self.rng.integers(0, x.shape[0], size=min(self.batch_size, x.shape[0]))
        xb, yb = x[idx], y[idx].astype(np.float64)
        p = self.weights
        if "w1" in p:
            pre = xb @ p["w1"] + p["b1"]
            h = np.maximum(pre, 0.0)
            z = h @ p["w2"] + p["b2"][0]
        else:
            z = xb @ p["w2"] + p["b2"][0]
        prob = 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))
        loss = float(np.mean(np.logaddexp(0.0, z) - yb * z))
        if not np.isfinite(loss):
            raise Diverged(f"loss is {loss} at step {self.steps_done + 1}")
        dz = (prob - yb) / xb.shape[0]
        grads = {"w2": (h.T @ dz if "w1" in p else xb.T @ dz) + self.l2 * p["w2"], "b2": np.array([dz.sum()])}
        if "w1" in p:
            dh = np.outer(dz, p["w2"]) * (pre > 0)
            grads["w1"] = xb.T @ dh + self.l2 * p["w1"]
            grads["b1"] = dh.sum(axis=0)
        t = self.steps_done + 1
        b1, b2, eps = _ADAM
        weights = {}
        for k, g in grads.items():
            m = b1 * self.moments[f"m_{k}"] + (1 - b1) * g
            v = b2 * self.moments[f"v_{k}"] + (1 - b2) * g * g
            weights[k] = p[k] - self.lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
            self.moments[f"m_{k}"], self.moments[f"v_{k}"] = m, v
        if not all(np.all(np.isfinite(w)) for w in weights.values()):
            raise Diverged(f"parameters are not finite at step {t}")
        self.weights, self.steps_done = weights, t
        return {"loss": loss}

    def state(self) -> TrainerState:
        arrays = {f"weights/{k}": v for k, v in self.weights.items()}
        arrays |= {f"adam/{k}": v for k, v in self.moments.items()}
        arrays |= {f"preprocessing/{k}": v for k, v in self.preprocessing.arrays().items()}
        return TrainerState(arrays, {"rng": self.rng.bit_generator.state, "steps_done": self.steps_done})

    def load_state(self, state: TrainerState) -> None:
        def section(prefix: str) -> dict[str, np.ndarray]:
            return {k.removeprefix(prefix): np.array(v) for k, v in state.arrays.items() if k.startswith(prefix)}

        self.weights, self.moments = section("weights/"), section("adam/")
        spec = {"revision": self.preprocessing.revision, "pool": self.preprocessing.pool}
        self.preprocessing = Preprocessor.from_arrays(spec, section("preprocessing/"))
        self.rng.bit_generator.state = state.scalars["rng"]
        self.steps_done = int(state.scalars["steps_done"])

    def predict(self, split: str) -> np.ndarray:
        return self._probabilities(self.data.partition(split).features)

    def serve(self, images: np.ndarray) -> np.ndarray:
        # The serving path: raw frames through the preprocessing kept in this trainer's state.
        return self._probabilities(self.preprocessing(images))

    def _probabilities(self, x: np.ndarray) -> np.ndarray:
        p = self.weights
        z = (np.maximum(x @ p["w1"] + p["b1"], 0.0) @ p["w2"] if "w1" in p else x @ p["w2"]) + p["b2"][0]
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))
