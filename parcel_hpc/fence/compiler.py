"""The programs ``torch.compile`` starts on the CPU, which a fenced process may start where the kernel
layer holds it: which files they are (found once, at arming) and the judgment of one start.

Inductor (torch's compiler) starts, from the process that compiles: its C++ compiler (``$CXX`` or
``g++``: its version, each kernel, the precompiled header), ``openssl sha512`` (that header's
checksum) and Python itself, once per instruction set (``python -c`` loading a test library: the ISA
probe). Under Landlock each is bound like the process that starts it, so none of them can read a
protected file; they are allowed as these programs only, never as programs trainer code steers:

- the program is a file found at arming, by inode, and the start runs that file and no other
  (``audit.py`` passes it to ``execve`` alone): a ``g++`` put on ``PATH`` later, or ``CXX`` pointed
  at a script, is another file;
- the variables that choose which other programs a compiler runs (``PATH``, where gcc finds ``as``
  and ``ld``; ``GCC_EXEC_PREFIX``; ``COMPILER_PATH``) hold what they held at arming, and the start gets
  the environment that was judged;
- no argument names a protected file, and none hands the compiler a program or a list of arguments
  of the caller's choosing (``-B``, ``-wrapper``, a plugin, ``-specs``, ``-fuse-ld``, ``@file``);
- Python runs only as the probe: ``-c`` and a script made of the probe's own lines.

Where a start passes, the program is recorded (``audit.allowed``). What it then opens that no
argument names (a header a source includes, a library ``LD_PRELOAD`` or ``PYTHONPATH`` loads into
it) is the kernel's alone: denied, and not recorded, like C code in the process itself.

Must not: allow anything where the kernel layer is not armed (``audit.py`` asks only under
Landlock); call anything a module attribute could replace once judging (``judge_of`` binds it all).
"""

from __future__ import annotations

import importlib.util
import os
import posix
import shutil
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from parcel_hpc.fence.protected import Inode, inode_of

COMPILER_NAMES = ("g++", "c++", "gcc", "cc", "clang++", "clang")  # inductor's $CXX default, and what a conda gcc is named
HELPER_NAMES = ("openssl",)  # inductor checksums a precompiled header with `openssl sha512`
# What chooses the programs a compiler runs in turn (PATH, gcc's and clang's own variables) and what the
# dynamic loader or the probe's Python loads into them: each must be as it was at arming.
CHOOSERS = (
    "PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "GCC_COMPARE_DEBUG",
    "CCC_OVERRIDE_OPTIONS",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
)
# Options that hand a compiler a program or arguments from a file: the start's argv no longer says what runs.
STEERING = ("-B", "-wrapper", "-specs", "--specs", "-fuse-ld", "--ld-path", "@")
PLUGIN = "plugin"  # in any argument: gcc's -fplugin and -iplugindir, the linker's -plugin through -Wl, or -Xlinker
# The ISA probe's script (torch/_inductor/cpu_vec_isa.py ``_avx_py_load``, 2.1 to 2.13), one line at a time.
PROBE_LINES = frozenset({"", "import sys", 'if sys.platform != "linux":', "    import torch  # noqa: F401", "import torch", "from ctypes import cdll"})
PROBE_LOAD = ('cdll.LoadLibrary("', '")')  # the one line naming the library it loads

Judge = Callable[[Sequence[str], Sequence[str], Mapping[str, str], str | None], "Verdict"]


@dataclass(frozen=True)
class Verdict:
    """One start, judged: the file it runs, and why it may not start ("" when it may, None when it is
    none of the compiler's programs)."""

    path: str
    problem: str | None
    name: str = ""  # an allowed start: what it runs, for the record ("g++", "python (inductor's ISA probe)")
    settled: tuple[tuple[str, str | None], ...] = ()  # variables the start gets from the fence instead (None: removed)

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` as the allowed start runs with it."""
        whole = dict(env)
        for key, value in self.settled:
            if value is None:
                whole.pop(key, None)
            else:
                whole[key] = value
        return whole


@dataclass(frozen=True)
class Compilers:
    """The files the compiler's programs are, and what chose them, as they were at arming."""

    programs: Mapping[Inode, str]  # inode -> the program's name, for the record ("g++", "openssl")
    python: Inode  # this interpreter: the ISA probe's program
    choosers: tuple[tuple[str, str | None], ...]  # CHOOSERS' values
    torch_lib: str | None = None  # the folder of the torch installed here, whose libraries the probe's library links

    @classmethod
    def here(cls, environ: Mapping[str, str]) -> Compilers:
        """What ``environ``'s ``PATH`` and ``CXX`` find now, before any trainer code runs."""
        found: dict[Inode, str] = {}
        path = environ.get("PATH", os.defpath)
        for name in (environ.get("CXX", ""), *COMPILER_NAMES, *HELPER_NAMES):
            where = shutil.which(name, path=path) if name else None
            if where:
                found.setdefault(inode_of(os.stat(where)), os.path.basename(name))
        python = inode_of(os.stat(sys.executable)) if sys.executable else (-1, -1)  # an embedded interpreter: no probe to allow
        spec = importlib.util.find_spec("torch")  # found, not imported: nothing of torch runs at arming
        torch_lib = os.path.join(os.path.dirname(spec.origin), "lib") if spec is not None and spec.origin else None
        return cls(found, python, tuple((k, environ.get(k)) for k in CHOOSERS), torch_lib)


def counted(names: Sequence[str]) -> tuple[str, ...]:
    """Programs started, each once with its count, in the order first started: ("g++ x14", "openssl x2")."""
    return tuple(f"{name} x{names.count(name)}" for name in dict.fromkeys(names))


def judge_of(compilers: Compilers, reached: Callable[[str], str]) -> Judge:
    """The judgment of one start: ``judge(argv, candidates, env, cwd)`` -> its ``Verdict``.
    ``candidates``: the files ``execve`` tries in turn, the first executable file is the program;
    ``env``: all it gets; ``reached(path)``: the protected file ``path`` reaches ("" when none)."""
    stat_, access, x_ok, is_reg = posix.stat, posix.access, posix.X_OK, stat.S_ISREG
    os_error, value_error, len_ = OSError, ValueError, len
    programs, python, choosers = dict(compilers.programs), compilers.python, tuple(compilers.choosers)
    # The probe's Python gets what it loads from the fence: the torch library folder inductor puts first on
    # LD_LIBRARY_PATH (the one found at arming), and PYTHONPATH as at arming (inductor passes sys.path,
    # which trainer code may have changed; the probe's script imports nothing from it on Linux).
    at_arming = dict(choosers)
    loader = ":".join(p for p in (compilers.torch_lib, at_arming.get("LD_LIBRARY_PATH")) if p) or None
    probe_settled = (("LD_LIBRARY_PATH", loader), ("PYTHONPATH", at_arming.get("PYTHONPATH")))
    probe_chooses = tuple((k, v) for k, v in choosers if k not in dict(probe_settled))
    steering, plugin, probe_lines, (load_open, load_close), verdict = STEERING, PLUGIN, PROBE_LINES, PROBE_LOAD, Verdict

    def runs(candidates: Sequence[str]) -> tuple[str, Inode | None]:
        for path in candidates:
            try:
                st = stat_(path)
            except (os_error, value_error):
                continue
            if is_reg(st.st_mode) and access(path, x_ok):
                return path, (st.st_dev, st.st_ino)
        return "", None

    def placed(text: str, cwd: str | None) -> str:
        return text if text.startswith("/") or not cwd else cwd + "/" + text

    def named(arg: str, cwd: str | None) -> str:
        """The protected file an argument names: itself, after ``=``, after a one-letter option
        (``-I``), or from its first ``/`` (an absolute path glued to any option: ``-include/...``)."""
        for text in (arg, arg.partition("=")[2], arg[2:] if arg.startswith("-") else "", arg[arg.find("/") :] if "/" in arg else ""):
            if text and (found := reached(placed(text, cwd))):
                return found
        return ""

    def probe_problem(argv: Sequence[str], cwd: str | None) -> str:
        if len_(argv) != 3 or argv[1] != "-c":
            return "Python runs only as inductor's ISA probe (python -c and its script)"
        loads = 0
        for line in argv[2].split("\n"):
            if line in probe_lines:
                continue
            inside = line[len_(load_open) : -len_(load_close)]
            if line.startswith(load_open) and line.endswith(load_close) and '"' not in inside and "\\" not in inside and inside.endswith(".so"):
                if found := reached(placed(inside, cwd)):
                    return f"its script loads {found}"
                loads += 1
                continue
            return f"its script is not inductor's ISA probe ({line[:80]!r})"
        return "" if loads == 1 else "its script is not inductor's ISA probe (the probe loads exactly one library)"

    def judge(argv: Sequence[str], candidates: Sequence[str], env: Mapping[str, str], cwd: str | None) -> Verdict:
        path, inode = runs(candidates)
        if inode is None:
            return verdict(path, None)
        if inode != python and inode not in programs:
            return verdict(path, None)
        for key, value in probe_chooses if inode == python else choosers:
            if env.get(key) != value:
                return verdict(path, f"{key} is not what it was when the fence was armed, and it chooses what a compiler runs or loads")
        if inode == python:
            return verdict(path, probe_problem(argv, cwd), "python (inductor's ISA probe)", probe_settled)
        for arg in argv[1:]:
            if arg.startswith(steering) or plugin in arg:
                return verdict(path, f"the argument {arg[:80]!r} hands the compiler a program or arguments the fence cannot judge")
            if found := named(arg, cwd):
                return verdict(path, f"an argument names {found}")
        return verdict(path, "", programs[inode])

    return judge
