"""The peer's side of bench_ledger: Optuna's JournalStorage on a JournalFileBackend (fsync per
append, the symlink lock), N intermediate values reported by each of P processes, then a fresh
storage replaying the file. Prints JSON: seconds for the appends and for the replay."""

import json
import multiprocessing
import sys
import time

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend


def storage(path: str) -> JournalStorage:
    return JournalStorage(JournalFileBackend(path))


def report(path: str, study: str, n: int) -> None:
    s = storage(path)
    study_id = s.get_study_id_from_name(study)
    trial_id = s.create_new_trial(study_id)
    for step in range(n):
        s.set_trial_intermediate_value(trial_id, step, 0.5 + step * 1e-4)


def main() -> None:
    path, n, procs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage(path).create_new_study([optuna.study.StudyDirection.MINIMIZE], "bench")
    t0 = time.perf_counter()
    workers = [multiprocessing.Process(target=report, args=(path, "bench", n)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    appended = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh = storage(path)
    trials = fresh.get_all_trials(fresh.get_study_id_from_name("bench"))
    folded = time.perf_counter() - t0
    assert sum(len(t.intermediate_values) for t in trials) == n * procs
    print(json.dumps({"append_s": appended, "fold_s": folded}))


if __name__ == "__main__":
    main()
