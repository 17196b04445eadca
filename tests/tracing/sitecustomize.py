"""Loaded by every Python process of a traced test (through PYTHONPATH): logs each open of the files
named in PARCEL_TRACE_FILES (os.pathsep-separated) with the process's argv, to
PARCEL_TRACE_OPENS/opens-<pid>.jsonl. An audit hook sees every open, whoever calls it."""

import json
import os
import sys

_LOG_DIR = os.environ.get("PARCEL_TRACE_OPENS")
_WATCHED = {os.path.realpath(p) for p in os.environ.get("PARCEL_TRACE_FILES", "").split(os.pathsep) if p}


def _hook(event, args):
    if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.path.realpath(os.fsdecode(args[0]))
    if path in _WATCHED:
        line = json.dumps({"pid": os.getpid(), "path": path, "argv": sys.argv}) + "\n"
        fd = os.open(os.path.join(_LOG_DIR, f"opens-{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


if _LOG_DIR and _WATCHED:
    sys.addaudithook(_hook)
