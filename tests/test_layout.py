"""The layout holds: no module-level import cycle, no lower layer importing a command, the pure
packing code without submitit, and the public API pinned (docs/architecture.md)."""

from __future__ import annotations

import ast
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


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


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


def test_one_default_for_how_many_checkpoints_a_trial_keeps():
    import yaml

    from parcel_hpc.checkpoints import KEEP_LAST
    from parcel_hpc.config import CONF_DIR, CheckpointConf

    assert yaml.safe_load((CONF_DIR / "checkpoint" / "default.yaml").read_text())["keep_last"] == KEEP_LAST == CheckpointConf().keep_last
