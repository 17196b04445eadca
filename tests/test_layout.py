"""The layout holds: no module-level import cycle, the packages in layers that import only down,
no lower layer importing a command, the pure packing code without submitit, and the public API
pinned (docs/architecture.md)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import parcel_hpc
from parcel_hpc.commands import COMMANDS

PACKAGE = Path(parcel_hpc.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = ["parcel_hpc", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level_imports(me: str, path: Path) -> set[str]:
    """The parcel_hpc modules a module imports when it is imported (not inside functions, not
    under ``if TYPE_CHECKING``). Importing ``a.b.c`` runs ``a.b`` first, except where ``a.b`` is the
    importer's own package, which is already importing it (a submodule of a package whose
    ``__init__`` re-exports it); naming the own package (``from a.b import x``) still counts."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names)
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                for a in sub.names:  # a submodule by name imports the submodule, a name its module
                    found.add(f"{sub.module}.{a.name}" if f"{sub.module}.{a.name}" in MODULES else sub.module)
    own = {".".join(me.split(".")[:i]) for i in range(1, len(me.split(".")))}
    out = set()
    for name in found:
        parts = name.split(".")
        out.update(p for i in range(2, len(parts)) if (p := ".".join(parts[:i])) in MODULES and p not in own)
        if name in MODULES:
            out.add(name)
    return out


GRAPH = {name: _top_level_imports(name, path) - {name} for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_level_import_cycle():
    assert _cycles(GRAPH) == []


def _every_import(path: Path) -> set[str]:
    """The parcel_hpc modules a module names anywhere: inside functions and under ``TYPE_CHECKING`` too."""
    found: set[str] = set()
    for sub in ast.walk(ast.parse(path.read_text())):
        if isinstance(sub, ast.Import):
            found.update(a.name for a in sub.names)
        elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
            found.update(f"{sub.module}.{a.name}" if f"{sub.module}.{a.name}" in MODULES else sub.module for a in sub.names)
    return {m for m in found if m in MODULES}


def test_no_import_cycle_hidden_inside_a_function():
    """An import inside a function is for a library that is optional or slow to import, never to
    hide a cycle (rng read torch's generators from trainer.torch, which imports rng)."""
    assert _cycles({name: _every_import(path) - {name} for name, path in MODULES.items()}) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The packages (and top-level modules) in layers, lowest first (docs/architecture.md draws it): a
# module imports, when it is imported, only from its own layer or one below. Packages in one layer
# may import each other (the module graph stays acyclic: the test above). A name is a package or a
# module; a module named on its own is a pure one that serves below its package.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("console",),
    ("errors",),
    ("fsio", "ownership", "documents", "plotting", "probe", "identity", "gpus"),
    ("governance",),
    ("anchor", "budget", "pruning", "data", "checkpoints", "config"),
    ("ledger",),
    ("scheduler",),
    ("accounting.spend", "selection.store"),  # what a search spent, and the selection's records it counts: read by the lifecycle's settlement
    ("lifecycle",),
    ("accounting",),
    ("fence",),
    ("trainer",),
    ("worker",),
    ("selection",),
    ("propose",),
    ("integrations", "report"),
    ("release",),
    ("launch",),
    ("testing",),
    ("commands",),
    ("cli", "__main__"),
)


def _layer(module: str) -> int | None:
    """The layer of a module: its longest name in ``LAYERS`` (a module before its package)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        for i, layer in enumerate(LAYERS):
            if ".".join(parts[:n]) in layer:
                return i
    return None


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import of a module from a higher layer than its importer's. Importing a submodule runs
    its package's ``__init__`` first: one that imports nothing (a docstring) is no dependency."""
    out = set()
    for me, deps in graph.items():
        mine = _layer(me)
        for dep in deps:
            theirs = _layer(dep)
            if not graph.get(dep) and any(d.startswith(f"{dep}.") for d in deps):
                continue
            if mine is not None and theirs is not None and theirs > mine:
                out.add((me, dep))
    return out


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "parcel_hpc" and _layer(m) is None] == []
    named = [name for layer in LAYERS for name in layer]
    assert len(named) == len(set(named))
    assert all(any(m == f"parcel_hpc.{n}" or m.startswith(f"parcel_hpc.{n}.") for m in MODULES) for n in named)


def test_the_packages_import_only_down():
    assert _upward(GRAPH) == set()


def test_the_layer_check_finds_an_upward_import():
    assert _upward({"parcel_hpc.errors": {"parcel_hpc.governance.outcome"}, "parcel_hpc.ledger": {"parcel_hpc.errors"}}) == {
        ("parcel_hpc.errors", "parcel_hpc.governance.outcome")
    }


def test_only_the_cli_imports_command_modules():
    importers = {m for m, deps in GRAPH.items() if any(d.startswith("parcel_hpc.commands.") for d in deps) and not m.startswith("parcel_hpc.commands")}
    assert importers == set()


def test_every_registered_command_has_its_module_and_says_whether_it_reads_only():
    on_disk = {m.removeprefix("parcel_hpc.commands.") for m in MODULES if m.startswith("parcel_hpc.commands.")}
    assert on_disk == {c.module_name.removeprefix("parcel_hpc.commands.") for c in COMMANDS}
    for command in COMMANDS:
        module = command.load()
        assert isinstance(module.READ_ONLY, bool) and callable(module.add_arguments) and callable(module.run), command.name
        assert module.__doc__ and command.name in module.__doc__.split("\n")[0], command.name


def test_the_pure_packing_code_imports_no_scheduler_library():
    code = "import sys, parcel_hpc.scheduler.packing, parcel_hpc.probe, parcel_hpc.scheduler.slots; print(sorted(m for m in ('submitit', 'h5py', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_trials_worker_a_launch_and_a_read_command_load_what_they_use_and_no_more():
    """Every trial's job, every launch and every command pays its imports at start (a suite of short
    trials runs thousands): a worker loads neither Hydra nor pyarrow, a launch no pyarrow (the
    accounting tables' library, loaded by the reads that make one: reconcile, account, report), and
    ``status`` and ``logs``, which read the ledger alone, not numpy and h5py either (they were about
    half of such a command's start, docs/performance.md)."""
    loaded = "import sys, {}; print(sorted(m for m in ('hydra', 'pyarrow', 'numpy', 'h5py') if m in sys.modules))"
    for module, expected in (
        ("parcel_hpc.worker.gate, parcel_hpc.worker.task", "['h5py', 'numpy']"),
        ("parcel_hpc.launch.__main__, hydra_plugins.parcel_hpc_plugins.config", "['hydra']"),
        ("parcel_hpc.commands.status, parcel_hpc.commands.logs, parcel_hpc.cli, parcel_hpc.scheduler.registry", "[]"),
    ):
        out = subprocess.run([sys.executable, "-c", loaded.format(module)], capture_output=True, text=True, check=True).stdout
        assert out.strip() == expected, module


def test_the_public_api_is_pinned():
    assert parcel_hpc.__all__ == [
        "Contract",
        "Diverged",
        "Examples",
        "GovernanceRefusal",
        "InvalidPredictions",
        "Outcome",
        "ParcelError",
        "SearchDir",
        "Trainer",
        "TrainerState",
        "TrainingData",
        "TrialRecord",
        "TrialState",
        "UsageError",
        "__version__",
    ]
    for name in parcel_hpc.__all__:
        assert getattr(parcel_hpc, name) is not None, name
    assert (
        parcel_hpc.__version__
        == subprocess.run(
            [sys.executable, "-c", "import importlib.metadata as m; print(m.version('parcel_hpc'))"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )


def test_the_packages_that_resolve_names_on_first_use_resolve_each_they_export_from_its_module():
    """``parcel_hpc.data`` and ``parcel_hpc.testing`` name each export twice (the imports mypy reads,
    the table their ``__getattr__`` reads): the two agree, and each name is the module's own object."""
    for package in ("parcel_hpc.data", "parcel_hpc.testing"):
        module = importlib.import_module(package)
        table = vars(module)["_PUBLIC"]
        assert sorted(table) == sorted(module.__all__), package
        typed = {
            a.name
            for node in ast.parse(Path(module.__file__).read_text()).body
            if isinstance(node, ast.If)
            for imp in node.body
            if isinstance(imp, ast.ImportFrom)
            for a in imp.names
        }
        assert typed == set(table), package
        for name, where in table.items():
            assert getattr(module, name) is getattr(importlib.import_module(where), name), (package, name)


def test_one_default_for_how_many_checkpoints_a_trial_keeps():
    import yaml

    from parcel_hpc.checkpoints import KEEP_LAST
    from parcel_hpc.config import CONF_DIR, CheckpointConf

    assert yaml.safe_load((CONF_DIR / "checkpoint" / "default.yaml").read_text())["keep_last"] == KEEP_LAST == CheckpointConf().keep_last


def test_hydra_scanning_plugins_imports_neither_the_launch_nor_submitit():
    """Hydra imports every plugin module at each app's start (ours too, for any Hydra app in the
    environment): the sweeper's logic is imported lazily (``_impl``), when it runs."""
    code = (
        "import sys; from hydra.core.plugins import Plugins; from hydra.plugins.sweeper import Sweeper; "
        "found = [p.__module__ for p in Plugins.instance().discover(Sweeper)]; "
        "print(found); print(sorted(m for m in sys.modules if m == 'submitit' or m.startswith(('parcel_hpc.launch', 'hydra_plugins.parcel_hpc_plugins._impl'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert "hydra_plugins.parcel_hpc_plugins.sweeper" in out[0]
    assert out[1] == "[]"
