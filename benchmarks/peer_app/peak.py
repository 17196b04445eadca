"""Run ``-m MODULE ARGS...`` or ``-c CODE`` and print this process's peak RSS (VmHWM, KiB) last
on stderr: how bench_reconcile measures a whole command's memory. ``parcel-hpc`` leaves by
``os._exit`` (no atexit), so that exit prints it too."""

import atexit
import os
import runpy
import sys


def _peak() -> None:
    with open("/proc/self/status") as f:
        sys.stderr.write(next(line for line in f if line.startswith("VmHWM")).split()[1] + "\n")


def _exit_after_peak(code: int, _exit=os._exit) -> None:
    _peak()
    _exit(code)


atexit.register(_peak)
os._exit = _exit_after_peak
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    try:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
else:
    exec(compile(sys.argv[2], "<peak>", "exec"))
