"""What makes a search's trials comparable, and the refusals that keep them so.

contract.py    the frozen contract: canonical fields, digest, freeze-or-compare
admission.py   trial identity and admission, launch side and worker side (pure)
outcome.py     Outcome: every ``admit`` / ``reject:*`` / ``hold:*`` / ``evaluate:*`` / ``release:*``
               token, parsed and printed in one place
validation.py  validation at the door: every text that can reach a path, a job name or a script
image.py       the worker image digest: which software a trial ran with
metric.py      the miss-cost metric, by pinned revision
release_target.py  where release registers (folder or MLflow): checked, and what of it the contract pins
"""
