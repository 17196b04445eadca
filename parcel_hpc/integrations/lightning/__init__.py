"""Lightning's ``Trainer.fit`` under the governance, unchanged: ``Governed(run)`` (the callback), its
``resume()`` (the ``ckpt_path``), ``ResumableLoader`` (a train loader Lightning resumes mid-epoch)
and ``predictor`` (the served model from a saved state). docs/bring-your-own-model.md, "Lightning".

Optional: ``pip install -c constraints lightning`` beside the CPU (or CUDA) torch. Nothing outside this
package imports lightning.
"""

from parcel_hpc.integrations.lightning.callback import Governed, Ungoverned, predictor, probabilities
from parcel_hpc.integrations.lightning.loader import ResumableLoader

__all__ = ["Governed", "ResumableLoader", "Ungoverned", "predictor", "probabilities"]
