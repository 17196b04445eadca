"""What to try next: the pinned space and sampler, and the proposals they make (Hydra's Sweeper role).

space.py      the space in either syntax (space group, Hydra's sweep grammar), normalized; random and QMC draws
samplers.py   the pinned sampler: name, every option, revision
learning.py   a learning sampler's proposal through Optuna's ask-and-tell (pure)
proposals.py  proposals recorded create-exclusively, the Proposer, and their replay
specs.py      the contract from the composed config, trial specs and worker plans
audit.py      how each trial was proposed, and whether every proposal re-derives exactly
"""
