"""Where researchers already look: a search and its release in the tools a team runs.

Each backend is an optional extra, imported only inside its own module (the core never imports it):

mlflow/            MLflow: a client bound to one server, a search exported as runs (the registry
                   as a release target is ``release/mlflow_registry.py``)
huggingface/       the Hugging Face Trainer kept unchanged: a callback and a resume line (extra ``hf``)
optuna_journal.py  a search as an Optuna journal file that ``optuna-dashboard FILE`` opens
lightning/         Lightning: ``Trainer.fit`` kept, the ``Governed`` callback added (a function-form trainer)
"""
