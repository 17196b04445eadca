"""Benchmark: parse_sacct + job-run aggregation vs pyarrow's own CSV reader on the same dump.

    .venv/bin/python benchmarks/bench_sacct.py [--lines 1000000] [--repeat 3] [--no-memory]

Generates a realistic sacct dump in parcel_hpc's format (allocation + .batch + .extern rows
per job run, arrays whose last task carries the master id, ~10% requeued jobs with
REQUEUED / PREEMPTED / NODE_FAIL rows, a few running jobs) into a temp file, then times, best
of --repeat and interleaved so both see the same machine load:

    baseline   pyarrow.csv.read_csv(delimiter='|', quoting off, types inferred)
    parse      parcel_hpc.scheduler.slurm.sacct_parse.parse_sacct
    aggregate  totals_by_job(table): runs grouped per job id, GPU/CPU-hours, waits
    (run_table, the full per-run table with its text columns, is timed on its own too)

and prints the ratio (parse + aggregate) / baseline; the target is <= 2.0. Peak memory is
measured as the peak RSS (VmHWM) of a fresh child process that reads the file and does only
one of the two; both include the interpreter, pyarrow and the file's bytes. Times only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from parcel_hpc.scheduler.slurm.runs import run_table, totals_by_job
from parcel_hpc.scheduler.slurm.sacct import SACCT_FIELDS
from parcel_hpc.scheduler.slurm.sacct_parse import parse_sacct

_FINAL_STATES = np.array(["COMPLETED"] * 16 + ["FAILED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED by 0"])
_FINAL_EXIT = {"COMPLETED": "0:0", "FAILED": "1:0", "TIMEOUT": "0:0", "OUT_OF_MEMORY": "0:125", "CANCELLED by 0": "0:0"}
_REQUEUE_STATES = np.array(["REQUEUED", "PREEMPTED", "NODE_FAIL"])


def generate(n_lines: int, seed: int = 0) -> bytes:
    """A sacct --duplicates dump of exactly n_lines lines, built column-wise (a few seconds)."""
    rng = np.random.default_rng(seed)
    n_jobs = n_lines // 3 + 1  # more than enough; the table is cut to n_lines at the end
    # Arrays: consecutive jobs share a master id; the last task takes the master's raw id.
    sizes = rng.choice([1, 1, 1, 1, 4, 10, 50], size=n_jobs)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), n_jobs) + 1]
    group = np.repeat(np.arange(len(sizes)), sizes)[:n_jobs]
    size = sizes[group]
    first_in_group = np.r_[0, np.cumsum(sizes)[:-1]][group]
    task = np.arange(n_jobs) - first_in_group
    master = 1000 + first_in_group
    raw = np.where(task == size - 1, master, master + 1 + task)
    master_s = pa.array(master).cast(pa.string())
    job_id = pc.if_else(pa.array(size > 1), pc.binary_join_element_wise(master_s, pa.array(task).cast(pa.string()), "_"), master_s)

    runs = rng.choice([1, 2, 3], size=n_jobs, p=[0.9, 0.07, 0.03])
    job_of = np.repeat(np.arange(n_jobs), runs)  # one entry per job run
    attempt = np.arange(len(job_of)) - np.repeat(np.cumsum(runs) - runs, runs)
    is_final = attempt == runs[job_of] - 1
    n_att = len(job_of)
    job_submit = 1_793_000_000 + rng.integers(0, 2_000_000, size=n_jobs)
    submit = job_submit[job_of] + attempt * 30_000
    start = submit + rng.integers(0, 3600, size=n_att)
    elapsed = rng.integers(1, 20_000, size=n_att)
    end = start + elapsed
    final = rng.choice(_FINAL_STATES, size=n_att)
    state = np.where(is_final, final, rng.choice(_REQUEUE_STATES, size=n_att))
    running = is_final & (rng.random(n_att) < 0.01)
    state = np.where(running, "RUNNING", state)
    exit_code = np.vectorize(_FINAL_EXIT.get, otypes=[object])(np.where(is_final, final, "COMPLETED"))
    exit_code = np.where(running, "0:0", exit_code)
    gpus = rng.choice([0, 1, 1, 2, 4, 8], size=n_jobs)[job_of]
    cpus = rng.choice([1, 2, 4, 8, 16], size=n_jobs)[job_of]
    cpu_choices, gpu_choices = (1, 2, 4, 8, 16), (0, 1, 2, 4, 8)
    combos = [(c, g) for c in cpu_choices for g in gpu_choices]
    step_tres = np.array([f"cpu={c}," + (f"gres/gpu={g}," if g else "") + f"mem={4 * c}G,node=1" for c, g in combos], dtype=object)
    alloc_tres = np.array([f"billing={c + 10 * g}," + t for (c, g), t in zip(combos, step_tres)], dtype=object)
    tres_index = np.searchsorted(cpu_choices, cpus) * len(gpu_choices) + np.searchsorted(gpu_choices, gpus)
    step_tres_col, alloc_tres_col = step_tres[tres_index], alloc_tres[tres_index]
    node = pa.array(np.char.add("n", rng.integers(1, 65, size=n_jobs).astype(str))[job_of])

    def ts(values: np.ndarray, unknown: np.ndarray | None = None) -> pa.Array:
        text = pc.strftime(pa.array(values.astype("datetime64[s]")), format="%Y-%m-%dT%H:%M:%S")
        return text if unknown is None else pc.if_else(pa.array(unknown), "Unknown", text)

    jid = job_id.take(pa.array(job_of))
    rid = pa.array(raw[job_of]).cast(pa.string())
    empty = pa.array([""] * n_att)
    common = {
        "ExitCode": pa.array(exit_code),
        "Submit": None,
        "Start": ts(start),
        "End": ts(end, running),
        "ElapsedRaw": pa.array(elapsed).cast(pa.string()),
        "NodeList": node,
        "Account": pa.array(["parcel"] * n_att),
    }
    alloc = dict(
        common,
        JobID=jid,
        JobIDRaw=rid,
        JobName=pc.binary_join_element_wise("trial-", pa.array(job_of % 97).cast(pa.string()), ""),
        State=pa.array(state),
        Submit=ts(submit),
        AllocTRES=pa.array(alloc_tres_col),
        Partition=pa.array(["gpu"] * n_att),
        QOS=pa.array(["normal"] * n_att),
        User=pa.array(["alice"] * n_att),
        Reason=pa.array(["None"] * n_att),
    )
    step_state = pa.array(np.where(state == "COMPLETED", "COMPLETED", np.where(running, "RUNNING", "CANCELLED")))
    tables = [pa.table({f: alloc[f] for f in SACCT_FIELDS})]
    for step in ("batch", "extern"):
        cols = dict(
            common,
            ExitCode=common["ExitCode"] if step == "batch" else pa.array(["0:0"] * n_att),
            JobID=pc.binary_join_element_wise(jid, step, "."),
            JobIDRaw=pc.binary_join_element_wise(rid, step, "."),
            JobName=pa.array([step] * n_att),
            State=step_state if step == "batch" else pa.array(["COMPLETED"] * n_att),
            Submit=ts(start),
            AllocTRES=pa.array(step_tres_col),
            Partition=empty,
            QOS=empty,
            User=empty,
            Reason=empty,
        )
        tables.append(pa.table({f: cols[f] for f in SACCT_FIELDS}))
    order = np.arange(3 * n_att).reshape(3, n_att).T.ravel()[:n_lines]
    dump = pa.concat_tables(tables).take(pa.array(order))
    sink = pa.BufferOutputStream()
    pacsv.write_csv(dump, sink, pacsv.WriteOptions(include_header=False, delimiter="|", quoting_style="none"))
    return sink.getvalue().to_pybytes()


def baseline(data: bytes) -> pa.Table:
    return pacsv.read_csv(
        pa.py_buffer(data),
        read_options=pacsv.ReadOptions(autogenerate_column_names=True),
        parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False),
    )


def ours(data: bytes) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    table = parse_sacct(data, source="bench")
    t1 = time.perf_counter()
    totals_by_job(table)
    t2 = time.perf_counter()
    run_table(table)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


# VmHWM (peak RSS) is per address space, so a fresh exec starts from zero; ru_maxrss would
# inherit this (large) parent's peak across fork+exec.
_CHILD = """
import sys
data = open(sys.argv[2], 'rb').read()
if sys.argv[1] == 'baseline':
    import pyarrow as pa, pyarrow.csv as c
    c.read_csv(pa.py_buffer(data), read_options=c.ReadOptions(autogenerate_column_names=True),
               parse_options=c.ParseOptions(delimiter='|', quote_char=False))
else:
    from parcel_hpc.scheduler.slurm.runs import totals_by_job
    from parcel_hpc.scheduler.slurm.sacct_parse import parse_sacct
    totals_by_job(parse_sacct(data, source='bench'))
print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))
"""


def peak_rss_mb(which: str, path: str) -> float:
    out = subprocess.run([sys.executable, "-c", _CHILD, which, path], check=True, capture_output=True, text=True)
    return int(out.stdout.strip()) / 1024  # kB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the two child processes measuring peak RSS")
    args = parser.parse_args()

    t0 = time.perf_counter()
    data = generate(args.lines)
    gen_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="bench_sacct_") as tmp:
        path = os.path.join(tmp, "sacct_dump.txt")
        with open(path, "wb") as f:
            f.write(data)
        with open(path, "rb") as f:  # what reconcile --sacct-file does: bytes from the file
            data = f.read()
        print(
            f"dump: {args.lines:,} lines, {len(data) / 1e6:.1f} MB, generated in {gen_s:.1f}s; "
            f"pyarrow {pa.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
        )
        base_times, parse_times, agg_times, table_times = [], [], [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            baseline(data)
            base_times.append(time.perf_counter() - t)
            p, a, at = ours(data)
            parse_times.append(p)
            agg_times.append(a)
            table_times.append(at)
        totals = [p + a for p, a in zip(parse_times, agg_times)]
        best_base, best_ours = min(base_times), min(totals)
        print(f"baseline pyarrow.csv.read_csv : best {best_base:.3f}s  (all: {', '.join(f'{x:.2f}' for x in base_times)})")
        print(f"parse_sacct                   : best {min(parse_times):.3f}s  (all: {', '.join(f'{x:.2f}' for x in parse_times)})")
        print(f"totals_by_job                 : best {min(agg_times):.3f}s  (all: {', '.join(f'{x:.2f}' for x in agg_times)})")
        print(f"run_table (not in ratio)      : best {min(table_times):.3f}s  (all: {', '.join(f'{x:.2f}' for x in table_times)})")
        print(f"parse + aggregate             : best {best_ours:.3f}s")
        print(f"ratio (parse + aggregate) / baseline = {best_ours / best_base:.2f}  (target <= 2.0)")
        if not args.no_memory:
            print(f"peak RSS, child process: baseline {peak_rss_mb('baseline', path):.0f} MB, parse + aggregate {peak_rss_mb('ours', path):.0f} MB")
        print(f"load average at the end: {os.getloadavg()[0]:.2f}; max RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
