"""MLflow, where a team keeps its models and looks at its runs (the ``mlflow`` extra).

client.py    a client bound to one tracking URI, and the one line an unreachable server is
runs.py      a search as MLflow runs: one parent per search, one child per trial (export --to mlflow)

The Model Registry as a release target is the release package's: ``release/mlflow_registry.py``.
mlflow is imported inside functions only, so importing this package never loads it.
"""
