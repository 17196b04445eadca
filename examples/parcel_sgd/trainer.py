"""SGDClassifier (log loss) on the pinned features, plus optional random Fourier features.

Everything that decides the next step is in ``state()``: the linear model (``coef_``,
``intercept_``, ``t_``), the random feature map, the preprocessing statistics for serving, and the
minibatch generator. A trainer rebuilt from the same params, seed and data and given that state
continues bit for bit, which is what lets a preempted trial end with the uninterrupted metric. Built
without examples (``parcel_hpc.trainer.serving_data``) and given that state, it serves: what a
registry entry does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.kernel_approximation import RBFSampler
from sklearn.linear_model import SGDClassifier

from parcel_hpc.data.preprocessing import Preprocessor
from parcel_hpc.trainer import Diverged, Param, Trainer, TrainerState, TrainingData

CLASSES = np.array([False, True])


class SGDTrainer(Trainer):
    unit = "step"  # one partial_fit call on one minibatch
    # What build() reads: the launch checks the space and the baseline against this before freezing.
    parameters = {"lr": Param(float), "batch_size": Param(int, default=64), "l2": Param(float, default=1e-4), "hidden": Param(int, default=0)}

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        self.data = data
        self.preprocessing = data.preprocessing
        self.batch_size = int(params["batch_size"])
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.model = SGDClassifier(
            loss="log_loss",
            penalty="l2",
            alpha=float(params["l2"]),
            learning_rate="constant",
            eta0=float(params["lr"]),
            shuffle=False,
            random_state=seed,
        )
        hidden = int(params["hidden"])
        self.rff = None
        if hidden > 0:
            n_features = data.train.features.shape[1]
            # fit draws the map from the feature count and the seed alone: no example is needed (a served trainer has none)
            self.rff = RBFSampler(gamma=1.0 / n_features, n_components=hidden, random_state=seed).fit(np.zeros((1, n_features)))
        self.x_train = self._expand(data.train.features)
        self.x_validation = self._expand(data.validation.features)

    def step(self) -> Mapping[str, float]:
        idx = self.rng.integers(0, len(self.x_train), size=min(self.batch_size, len(self.x_train)))
        xb, yb = self.x_train[idx], self.data.train.labels[idx]
        self.model.partial_fit(xb, yb, classes=CLASSES)
        if not (np.all(np.isfinite(self.model.coef_)) and np.all(np.isfinite(self.model.intercept_))):
            raise Diverged(f"SGD weights are not finite after {self.model.t_ - 1:.0f} samples")
        p = np.clip(self.model.predict_proba(xb)[:, 1], 1e-12, 1 - 1e-12)
        return {"loss": float(-np.mean(np.where(yb, np.log(p), np.log1p(-p))))}

    def state(self) -> TrainerState:
        arrays = {f"preprocessing/{k}": v for k, v in self.preprocessing.arrays().items()}
        if hasattr(self.model, "coef_"):
            arrays |= {"sgd/coef": self.model.coef_, "sgd/intercept": self.model.intercept_}
        if self.rff is not None:
            arrays |= {"rff/weights": self.rff.random_weights_, "rff/offset": self.rff.random_offset_}
        return TrainerState(arrays, {"rng": self.rng.bit_generator.state, "t": float(getattr(self.model, "t_", 1.0))})

    def load_state(self, state: TrainerState) -> None:
        a = state.arrays
        spec = {"revision": self.preprocessing.revision, "pool": self.preprocessing.pool}
        self.preprocessing = Preprocessor.from_arrays(spec, {"mean": a["preprocessing/mean"], "std": a["preprocessing/std"]})
        if self.rff is not None:
            self.rff.random_weights_, self.rff.random_offset_ = np.array(a["rff/weights"]), np.array(a["rff/offset"])
        if "sgd/coef" in a:
            # What partial_fit reads back on its next call: a fitted binary model at sample count t_.
            self.model.classes_ = CLASSES
            self.model.n_features_in_ = a["sgd/coef"].shape[1]
            self.model.coef_, self.model.intercept_ = np.array(a["sgd/coef"]), np.array(a["sgd/intercept"])
            self.model.t_ = float(state.scalars["t"])
        self.rng.bit_generator.state = state.scalars["rng"]

    def predict(self, split: str) -> np.ndarray:
        x = {"train": self.x_train, "validation": self.x_validation}[split]
        return self.model.predict_proba(x)[:, 1]

    def serve(self, images: np.ndarray) -> np.ndarray:
        # Raw frames -> the preprocessing and feature map kept in the state -> probabilities.
        return self.model.predict_proba(self._expand(self.preprocessing(images)))[:, 1]

    def _expand(self, x: np.ndarray) -> np.ndarray:
        if self.rff is None:
            return x
        if not len(x):  # a served trainer is built without examples (scikit-learn refuses to transform none)
            return np.zeros((0, x.shape[1] + self.rff.n_components))
        return np.hstack([x, self.rff.transform(x)])
