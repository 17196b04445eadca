"""Names that frameworks pass by keyword, which vulture cannot see being used (read by vulture only)."""

# Hydra calls Sweeper.setup(*, hydra_context, task_function, config).
hydra_context  # noqa: B018, F821
task_function  # noqa: B018, F821

# Lightning passes its hooks' and steps' arguments by position, but names them in its signatures.
batch_idx  # noqa: B018, F821
