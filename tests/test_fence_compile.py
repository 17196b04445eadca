"""torch.compile under the final partition's fence (issue 46): inductor's own programs start under
the kernel layer and are recorded, while every program trainer code starts or steers (``cat``, the
compiler naming the final list or told to run a program of its choosing, a ``g++`` put first on
``PATH``, a compiler named by inductor's ``cpp.cxx``, which ``CXX`` sets, Python with a script of its
own) is refused and recorded; without Landlock the compiler is refused too, saying why."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parcel_hpc.fence import compiler, kernel
from parcel_hpc.ledger import SearchDir, TrialState
from parcel_hpc.testing import launch, parcel_hpc

pytest.importorskip("torch")  # the [torch] extra; scripts/test.sh installs it
needs_landlock = pytest.mark.skipif(kernel.abi() < kernel.MIN_ABI, reason="this kernel has no Landlock ABI 2: torch.compile's programs stay refused")

UNSEEN = "(what a program opens is out of the fence's record)"
PROBE = r"""
import json, os, shutil, subprocess, sys, tempfile
from pathlib import Path
from parcel_hpc import fence, fsio
from parcel_hpc.fence import audit

split, snapshot, layer, fake, root = sys.argv[1:6]
final = os.path.join(os.path.dirname(split), "final-group_r8.json")
protected = fence.Protected.of(split, snapshot)
if layer == "audit":
    fence.arming.own_tempdir(protected)
    fsio.whole_names()
    audit.install(protected, kernel=False)  # as on a kernel without Landlock
else:
    fence.arm(protected)
import torch
import torch._inductor.config as inductor

out = {}
def tried(name, fn):
    try:
        got = fn()
        out[name] = "ran " + str(got)[:80]
    except Exception as exc:
        out[name] = f"refused {type(exc).__name__}"

def compiled(k):
    f = torch.compile(lambda x: (x * k + 1).relu().sum(), dynamic=False)
    return round(float(f(torch.arange(8.0) - 3)), 3)

tried("compile", lambda: compiled(2.0))
out["allowed"] = list(fence.allowed())
out["compile threads"] = inductor.compile_threads
if layer == "kernel":
    tried("cat", lambda: subprocess.run(["cat", final], capture_output=True).stdout)
    tried("g++ naming the final list", lambda: subprocess.run(["g++", "-x", "c++", "-E", final], capture_output=True).returncode)
    tried("g++ told to run a program", lambda: subprocess.run(["g++", "-wrapper", f"{fake}/g++,", "--version"], capture_output=True).returncode)
    tried("python with a script of its own", lambda: subprocess.run([sys.executable, "-c", f"print(open({final!r}).read())"], capture_output=True).stdout)
    gxx = shutil.which("g++")
    tried("g++ with a preexec_fn", lambda: subprocess.run([gxx, "--version"], preexec_fn=lambda: None, capture_output=True).returncode)
    # gcc finds its own programs from argv[0]: a folder of the trainer's named there must not choose them.
    tried("g++ named from a folder of its own", lambda: subprocess.run([f"{root}/bin/g++", "-print-prog-name=cc1plus"], executable=gxx, capture_output=True, text=True).stdout.strip())
    inductor.cpp.cxx = (None, f"{fake}/g++")  # what CXX set before torch's import does
    tried("compile with cpp.cxx a script", lambda: compiled(3.0))
    inductor.cpp.cxx = (None, "g++")
    os.environ["PATH"] = f"{fake}:" + os.environ["PATH"]
    tried("compile with a g++ first on PATH", lambda: compiled(4.0))
print(json.dumps({"tried": out, "recorded": list(fence.tripped())}))
"""


pytestmark = pytest.mark.xdist_group("fence-compile")  # one worker runs the module: inductor's compile cache filled once, not once a worker


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory) -> Path:
    """One compile cache for this module's tests: inductor builds each kernel once, not once a test.
    Not made here: the fence makes it before arming (``arming.compile_settings``)."""
    return tmp_path_factory.mktemp("compiled") / "inductor"


def _probe(layer: str, data_dir: Path, tmp_path: Path, cache: Path) -> tuple[dict, list]:
    fake = tmp_path / "fake"
    fake.mkdir()
    final = data_dir / "final-group_r8.json"
    (fake / "g++").write_text(f"#!/bin/sh\ncat {final}\n")  # a compiler that reads the final list
    (fake / "g++").chmod(0o755)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    env.pop("CXX", None)
    root = fake / "root"  # a gcc install of the trainer's: bin/g++ and the cc1plus beside it that gcc would run
    triple, version = (subprocess.run(["g++", f"-dump{what}"], capture_output=True, text=True).stdout.strip() for what in ("machine", "version"))
    libexec = root / "lib" / "gcc" / triple / version
    libexec.mkdir(parents=True)
    (root / "bin").mkdir()
    (libexec / "cc1plus").write_text(f"#!/bin/sh\ncat {final}\n")
    (libexec / "cc1plus").chmod(0o755)
    args = [sys.executable, "-c", PROBE, str(data_dir / "split-group_r8.json"), str(data_dir / "parcels.h5"), layer, str(fake), str(root)]
    probe = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert probe.returncode == 0, probe.stderr[-3000:]
    answer = json.loads(probe.stdout.splitlines()[-1])
    return answer["tried"], answer["recorded"]


@needs_landlock
def test_torch_compile_runs_under_the_kernel_layer_and_what_trainer_code_steers_is_refused_and_recorded(tmp_path, data_dir, inductor_cache):
    """A compiled function runs (its programs recorded: the C++ compiler and the ISA probe); ``cat``
    of the final list, the compiler naming it or given ``-wrapper``, Python with its own script, a
    compiler ``cpp.cxx`` names and a ``g++`` put first on ``PATH`` are each refused before they start,
    and each is recorded, so the trial that tried would be ``reject:final_partition``."""
    tried, recorded = _probe("kernel", data_dir, tmp_path, inductor_cache)
    assert tried["compile"] == "ran 25.0", tried  # relu(2x + 1) summed over x = -3..4, compiled and run
    assert tried["compile threads"] == 1  # in the process: with Triton installed, more would start a pool of Python workers
    allowed = tried["allowed"]
    assert "g++" in allowed and all(a in ("g++", "openssl", "python (inductor's ISA probe)") for a in allowed), allowed
    for way in ("cat", "g++ naming the final list", "g++ told to run a program", "python with a script of its own", "g++ with a preexec_fn"):
        assert tried[way] == "refused PermissionError", (way, tried)
    # It ran, as the compiler named by its own path: the cc1plus it would use is the system's, not the folder's.
    way = tried["g++ named from a folder of its own"]
    assert way.startswith("ran /") and "cc1plus" in way and str(tmp_path) not in way, way
    for way in ("compile with cpp.cxx a script", "compile with a g++ first on PATH"):
        assert tried[way].startswith("refused "), (way, tried)  # inductor says the compiler failed; the fence's record says why
    final = data_dir / "final-group_r8.json"
    fake = tmp_path / "fake" / "g++"
    assert recorded[0] == f"started the program cat {UNSEEN}", recorded
    assert f"an argument names {final}" in recorded[1]
    assert "the argument '-wrapper' hands the compiler a program" in recorded[2]
    assert "its script is not inductor's ISA probe" in recorded[3]
    assert recorded[4] == f"started the program {shutil.which('g++')} {UNSEEN}", recorded  # with a preexec_fn: never judged a compiler's
    # inductor's own `g++ --version` meets the fake first each time: the script named, then the g++ that PATH now finds.
    assert recorded[5:] == [f"started the program {fake} {UNSEEN}", f"started the program g++ {UNSEEN}"], recorded[5:]


def test_without_landlock_torch_compile_is_refused_saying_why(tmp_path, data_dir, inductor_cache):
    """The audit layer alone cannot see what a compiler opens: its start is refused and recorded,
    with the line that says so and what to do."""
    tried, recorded = _probe("audit", data_dir, tmp_path, inductor_cache)
    assert tried["compile"].startswith("refused "), tried
    assert tried["allowed"] == []
    assert recorded and "for torch.compile, which only a kernel with Landlock lets a fenced process start" in recorded[0], recorded


ROOT = Path(__file__).resolve().parents[1]
COMPILED_LOOP = [
    "trainer.target=parcel_loop:train_compiled",
    "~space.params.hidden",
    "~space.params.l2",
    "lr=choice(0.003,0.03)",
    "pruner=none",
    "train.steps=6",
]


@needs_landlock
def test_a_plain_loop_compiled_by_torch_compile_runs_a_search_under_the_fence(tmp_path, data_dir, inductor_cache):
    """Two trials of a plain PyTorch loop whose training forward is compiled (examples/parcel_loop,
    inductor: C++ on the CPU) run in one fenced worker, after the launch's fenced preflight compiled
    it and checked its resume: both complete, held by the kernel layer, and nothing is rejected. The
    compile cache lives outside the search, made before arming; the trainer's code copy holds nothing
    of it."""
    cache = inductor_cache
    overrides = [f"search.root={tmp_path}", "search.revision=compiled", "search.n_trials=2", "hydra.launcher.pack_size=2", "hydra.launcher.parallelism=1"]
    res = launch(
        [*overrides, *COMPILED_LOOP],
        cwd=tmp_path,
        data_dir=data_dir,
        env={"PYTHONPATH": str(ROOT / "examples"), "TORCHINDUCTOR_CACHE_DIR": str(cache)},
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    search = SearchDir(tmp_path / "compiled")
    records = [search.record(tid) for tid in sorted(search.trial_ids())]
    assert [r.state for r in records] == [TrialState.COMPLETED] * 2, [r.detail for r in records]
    admitted = [e for r in records for e in search.events(r.trial_id) if e.kind.value == "admitted"]
    assert {e.data.fence.value for e in admitted} == {"kernel"}
    # The pack's first trial compiled (its compiler recorded in its attempt); the second, in the same process, found it built.
    first = records[0].attempts[0].programs
    assert any(p.startswith("g++ x") for p in first) and all(p.split(" x")[0] in ("g++", "openssl", "python (inductor's ISA probe)") for p in first), first
    said = parcel_hpc(["logs", str(tmp_path / "compiled"), records[0].trial_id])
    assert f"torch.compile's programs, allowed by the fence under Landlock: {', '.join(first)}" in said.stdout, said.stdout
    assert any(p.suffix == ".so" for p in cache.rglob("*"))  # inductor built its kernels there
    copy = [p for p in (tmp_path / "compiled").rglob("*") if p.suffix in (".so", ".cpp")]
    assert copy == []  # nothing compiled lands in the search (its code copy included)


@needs_landlock
def test_check_trainer_resumes_a_compiled_cnn_exactly_in_a_fenced_child(data_dir, inductor_cache):
    """check-trainer runs the compiled CNN in its fenced child: a build, a checkpoint, a fresh build
    (compiled again) resumed from it, compared with the uninterrupted run: exact, with the kernels
    inductor built the same way each time; the preflight's corners and baseline pass too."""
    res = parcel_hpc(
        ["check-trainer", "parcel_cnn:CompiledParcelCNN", "space=cnn_compiled", "selection/baseline=cnn_approved"]
        + [f"hydra.searchpath=[file://{ROOT / 'examples' / 'parcel_cnn' / 'conf'}]", "--data", str(data_dir), "--steps", "4"],
        env={"PYTHONPATH": str(ROOT / "examples"), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resumed trainer predicts exactly as the uninterrupted one" in res.stdout and "FAILED" not in res.stdout, res.stdout


PROBE_SCRIPT = '\nimport sys\nif sys.platform != "linux":\n    import torch  # noqa: F401\nfrom ctypes import cdll\ncdll.LoadLibrary("/cache/th/k.so")\n'


def test_one_start_is_judged_by_the_file_it_runs_its_arguments_and_what_chooses_its_programs(tmp_path):
    """The judgment alone, with plain values: the compiler found at arming passes with inductor's
    kind of arguments; a script beside it, a steering option, an argument reaching a protected file
    and a PATH changed since arming do not; Python passes only as the ISA probe (pure but for stat)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("g++", "cat"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    secret = tmp_path / "final-r8.json"
    secret.write_text("{}")
    path = f"{folder}:/usr/bin"
    found = compiler.Compilers.here({"PATH": path})
    judge = compiler.judge_of(found, lambda text: str(secret) if os.path.exists(text) and os.path.samefile(text, secret) else "")
    env = {"PATH": path}
    gxx, cat, python = str(folder / "g++"), str(folder / "cat"), sys.executable

    def said(argv, env=env, exe=None):
        v = judge(argv, [exe or argv[0]], env, None)
        return v.problem if v.problem is None or v.problem == "" else v.problem.split(" (")[0]

    assert said([gxx, "k.cpp", "-O3", "-include", "/cache/pch.h", "-o", "k.so", "-ffp-contract=off"]) == ""
    assert judge([gxx, "--version"], [str(tmp_path / "nothing"), gxx], env, None).name == "g++"  # the first file execve can run
    assert said([cat, str(secret)]) is None  # none of the compiler's: the audit layer's own refusal
    assert said([gxx, "-x", "c++", str(secret)]) == f"an argument names {secret}"
    assert said([gxx, f"-include{secret}"]) == f"an argument names {secret}"
    assert said([gxx, f"--param={secret}"]) == f"an argument names {secret}"
    for option in ("-B/tmp", "-wrapper", "-fplugin=x.so", "-Wl,-plugin=x.so", "-specs=x", "-fuse-ld=/tmp/ld", "@args"):
        assert said([gxx, option]).startswith(f"the argument {option!r} hands the compiler"), option
    assert said([gxx, "--version"], env={"PATH": f"/tmp:{path}"}).startswith("PATH is not what it was when the fence was armed")
    assert said([gxx, "--version"], env={**env, "GCC_EXEC_PREFIX": "/tmp/"}).startswith("GCC_EXEC_PREFIX is not what it was")
    for steer in ("CCC_OVERRIDE_OPTIONS", "LD_PRELOAD", "LD_AUDIT", "GCC_COMPARE_DEBUG"):  # an option, a library, a second run put in by the environment
        assert said([gxx, "--version"], env={**env, steer: "/tmp/x.so"}).startswith(f"{steer} is not what it was"), steer
    assert said([python, "-c", PROBE_SCRIPT]) == ""
    assert said([python, "-c", PROBE_SCRIPT], env={**env, "LD_PRELOAD": "/tmp/x.so"}).startswith("LD_PRELOAD is not what it was")
    # What inductor hands the probe (sys.path as PYTHONPATH, its torch first on LD_LIBRARY_PATH) is not what it runs with:
    # the fence's own (a sitecustomize on a path trainer code chose, or another torch lib folder, never loads).
    steered = {**env, "PYTHONPATH": "/tmp", "LD_LIBRARY_PATH": "/tmp/lib"}
    probe = judge([python, "-c", PROBE_SCRIPT], [python], steered, None)
    assert probe.problem == "" and probe.environment(steered) == {"PATH": path, "LD_LIBRARY_PATH": found.torch_lib}, probe
    library = tmp_path / "final-r8.so"  # a protected file the probe's one load names
    library.write_bytes(b"")
    judge_library = compiler.judge_of(found, lambda text: str(library) if os.path.exists(text) and os.path.samefile(text, library) else "")
    assert judge_library([python, "-c", PROBE_SCRIPT.replace("/cache/th/k.so", str(library))], [python], env, None).problem == f"its script loads {library}"
    assert said([python, "-c", PROBE_SCRIPT.replace("/cache/th/k.so", str(secret))]).startswith("its script is not inductor's ISA probe")
    assert said([python, "-c", "import os"]) == "its script is not inductor's ISA probe"
    assert said([python, "-c", PROBE_SCRIPT + PROBE_SCRIPT.split("\n")[-2]]) == "its script is not inductor's ISA probe"
    assert said([python, "-m", "torch._inductor.compile_worker"]) == "Python runs only as inductor's ISA probe"
    assert compiler.counted(["g++", "python", "g++"]) == ("g++ x2", "python x1")
