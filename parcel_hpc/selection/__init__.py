"""Select once, then evaluate: freeze the completed list, rerun the winner, gate on slices against
an approved baseline, record quality decisions, evaluate the protected final partition once.

    policy.py       SelectionPolicy: the pinned ``selection`` group, typed and checked
    baseline.py     the approved baseline (trained with its own trainer, or a released artifact), checked at launch
    candidates.py   (pure) clean lineage, the frozen completed list and its digest
    slices.py       (pure) slice reports and the slice gate
    gangs.py        (pure) a gang's trial: are its checkpoint parts replicas (rank 0's serves for all); the shape a selection job runs as
    disposition.py  (pure) hold:budget / hold:invalid-winner / hold:slice-quality / evaluate:final-holdout
    store.py        where selections, job results, the final claim and the plan live
    jobs.py         the model work, run as scheduler jobs (``parcel-hpc selection-job``)
    submit.py       run a job on the search's own launcher (local process or sbatch template)
    gates.py        (pure) one class per release gate: what select and release both check
    actions.py      select, decide, evaluate-final
"""
