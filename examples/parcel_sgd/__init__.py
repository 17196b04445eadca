"""An example of bringing your own model: scikit-learn's SGDClassifier, trained with ``partial_fit``.

Run a search with it from the repository root::

    PYTHONPATH=examples python -m parcel_hpc.launch -m trainer.target=parcel_sgd:SGDTrainer

It takes the same params as the built-in trainer (``space=space_r4``): ``lr`` is SGD's constant
step size, ``l2`` its L2 penalty, ``batch_size`` the minibatch of one step, and ``hidden`` adds that
many random Fourier features (scikit-learn's ``RBFSampler``) to the pinned preprocessing's features.
"""

from .trainer import SGDTrainer

__all__ = ["SGDTrainer"]
