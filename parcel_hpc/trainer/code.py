"""The trainer's code, frozen with the contract: a content-addressed copy in the search directory.

At the first freeze the launch copies the package that holds the trainer (its outermost regular
package, or the module file alone), and every package ``trainer.code`` names, into
``<search>/code/<digest>/``; every worker and selection job imports that copy, never the working
tree (what Ray's ``working_dir`` and submitit's code snapshots do). Editing or deleting the working
tree then cannot touch a running search, and a relaunch from changed code differs in
``source_digest``: ``reject:trainer`` at the door. A trainer that is part of parcel_hpc (the
built-in one) is part of the worker image instead, and is imported as installed.

The copy is held to its digest whole: the working tree's caches, bytecode and hidden files are
left out of the copy, and every file the copy holds counts (``copy_digest``), so a file added to it
later (a ``.pyc`` beside its source, a module of the same name, a ``.so``) is a copy that is not
the contract's code, refused before anything of it is imported. And nothing is ever imported from
it but its sources: its packages are found only in the copy, whatever the working directory or
``sys.path`` holds, and compiled from source at each import, never from bytecode, which is never
written into it either (``_CopyFinder``). Why not digest the bytecode instead: it is rewritten by
each Python version and whenever a source's mtime changes, so a digest of it would change under a
running search; compiling a trainer's few modules costs milliseconds.

Owns: which files are the trainer's code, their digest, the copy, importing a trainer from it,
and the third-party distributions the code imports (from its import statements, lazy ones
included), pinned with their versions. Must not: build or run a trainer.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import importlib.util
import inspect
import os
import shutil
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from parcel_hpc import anchor
from parcel_hpc.errors import UsageError
from parcel_hpc.fsio import FILE_MODE, ensure_dir, fsync_dir
from parcel_hpc.governance.image import name_and_version
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome

CODE_DIR = "code"  # under the search directory
MAX_BYTES = 64 * 2**20  # a trainer's package is code, not data: more is a mistake worth a line
_TOOLKIT = __name__.split(".")[0]  # parcel_hpc: covered by the image digest, never copied
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


@dataclass(frozen=True)
class CodeRoot:
    """One importable unit of the trainer's code: a package directory or a top-level module file."""

    module: str  # dotted name, e.g. "examples.parcel_sgd" or "my_trainer"
    path: Path

    def files(self) -> Iterator[tuple[str, Path]]:
        """(path inside the copy, file) for every file of the unit, sorted; caches and hidden files left out."""
        prefix = self.module.replace(".", "/")
        if self.path.is_file():
            yield prefix + self.path.suffix, self.path
            return
        for rel, file in _tree_files(self.path):
            yield f"{prefix}/{rel}", file


def _tree_files(top: Path) -> list[tuple[str, Path]]:
    """(path below ``top``, file) for every file a copy holds, sorted: caches, bytecode and hidden
    files left out, so the bytecode an import writes into a copy never changes its digest."""
    out = []
    for file in sorted(top.rglob("*")):
        rel = file.relative_to(top)
        if file.is_file() and file.suffix not in _SKIP_SUFFIXES and not any(p in _SKIP_DIRS or p.startswith(".") for p in rel.parts):
            out.append((rel.as_posix(), file))
    return out


def code_roots(target: str, extra: Sequence[str] = ()) -> list[CodeRoot]:
    """The units to copy for ``target`` (imported already) and the ``extra`` packages the config names."""
    module_name = target.partition(":")[0]
    roots: dict[str, CodeRoot] = {}
    for name in [module_name, *extra]:
        if name.split(".")[0] == _TOOLKIT:
            continue
        root = _root_of(name, target)
        roots.setdefault(root.module, root)
    for a in roots:
        for b in roots:
            if a != b and b.startswith(a + "."):
                raise UsageError(f"trainer.code names {b}, which lies inside {a}; list {a} alone")
    return [roots[k] for k in sorted(roots)]


def _root_of(name: str, target: str) -> CodeRoot:
    """The outermost regular package holding module ``name``, found without running any of its code:
    only the namespace packages above it are imported, and those hold none. The launch's own process
    finds it so (for the copy); the trainer's code itself runs only behind the fence (``importable``)."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        try:
            spec = importlib.util.find_spec(prefix)
        except (ImportError, ValueError) as exc:
            spec, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = f"no module named {prefix}"
        if spec is None:
            raise UsageError(f"trainer.code names {name}, which does not import ({why}); name a package importable where the launch runs")
        if spec.origin and spec.has_location:
            path = Path(spec.origin).resolve()
            return CodeRoot(prefix, path.parent if path.name == "__init__.py" else path)
    raise UsageError(f"trainer.target={target}: {name} is a namespace package with no files; name a module or a regular package")


def importable(names: Sequence[str]) -> None:
    """Import each of ``names`` (trainer code: call it behind the fence); ``UsageError`` for one that fails."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # user code: any import error is the same bad input
            raise UsageError(
                f"trainer.code names {name}, which does not import ({type(exc).__name__}: {exc}); name a package importable where the launch runs"
            ) from None


def source_digest(roots: Sequence[CodeRoot]) -> str:
    """sha256 over the path and bytes of every file the copy holds. ``UsageError`` past ``MAX_BYTES``."""
    items = [(rel, file) for root in roots for rel, file in root.files()]
    total = sum(file.stat().st_size for _, file in items)
    if total > MAX_BYTES:
        biggest = max(items, key=lambda item: item[1].stat().st_size)[1]
        raise UsageError(
            f"the trainer's code ({', '.join(r.module for r in roots)}) holds {total >> 20} MiB, {biggest} the largest; "
            f"keep data and checkpoints out of the trainer's package (the search copies it whole, up to {MAX_BYTES >> 20} MiB)"
        )
    return _digest(items)


def _digest(items: Sequence[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for rel, file in sorted(items):
        h.update(rel.encode() + b"\0" + file.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def module_digest(module: Any) -> str:
    """A parcel_hpc trainer's digest: the ``.py`` files of the package that holds it."""
    path = Path(inspect.getfile(module)).resolve()
    h = hashlib.sha256()
    for file in sorted(path.parent.rglob("*.py")):
        if "__pycache__" not in file.parts:
            h.update(str(file.relative_to(path.parent)).encode() + b"\0" + file.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def snapshot_dir(search_dir: str | os.PathLike, digest: str) -> Path:
    return Path(search_dir) / CODE_DIR / digest.partition(":")[2]


def freeze(search_dir: str | os.PathLike, identity: Mapping[str, Any]) -> Path | None:
    """Copy the trainer's code into the search (once: an existing copy is the same by its name).
    The copy is checked against the digest the contract froze: code edited while the launch ran is
    ``reject:trainer`` and leaves no copy. None for a trainer that is part of the image."""
    modules = list(identity.get("code", ()))
    if not modules:
        return None
    dest = snapshot_dir(search_dir, str(identity["source_digest"]))
    if not dest.is_dir():
        files = [item for root in code_roots(str(identity["target"]), modules) for item in root.files()]
        _copy_whole(
            files,
            dest,
            str(identity["source_digest"]),
            "the trainer's code changed while the launch copied it; leave it alone while a launch freezes, then relaunch",
        )
    return dest


def _copy_whole(files: Sequence[tuple[str, Path]], dest: Path, digest: str, changed: str) -> None:
    """``files`` (path in the copy, source) copied to ``dest`` whole or not at all: each file and
    directory fsync'd in a temporary directory beside it, the copy's digest checked against
    ``digest`` (``reject:trainer`` with ``changed`` otherwise), then one rename. A concurrent
    identical copy that renamed first is as good (its name is its digest)."""
    tmp = ensure_dir(dest.parent) / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        for rel, file in files:
            out = tmp / rel
            ensure_dir(out.parent)
            shutil.copyfile(file, out)
            os.chmod(out, FILE_MODE)  # the workers import it: nobody else may write it, whatever the umask
            with open(out, "rb+") as f:
                os.fsync(f.fileno())
        copied = _copy_digest(tmp)
        if copied != digest:
            raise GovernanceRefusal(Outcome.reject("trainer"), f"{changed} ({copied} against {digest})")
        for directory in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(directory)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
        fsync_dir(dest.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy_digest(top: Path) -> str:
    """The digest of a copy: every file it holds, computed as ``source_digest`` computed it from the
    working tree's sources (a copy that holds exactly those has the same digest)."""
    return _digest(_whole(top)[0])


def _whole(top: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """(path below ``top``, file) for every regular file under ``top``, nothing left out, and what
    else is there (a link, a FIFO: never part of a copy), by path below ``top``. Links are not followed."""
    files, others = [], []
    pending = [top]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                rel = Path(entry.path).relative_to(top).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    files.append((rel, Path(entry.path)))
                else:
                    others.append(rel)
    return sorted(files), sorted(others)


def copy_problem(copy: Path, digest: str) -> str:
    """Why the code copy at ``copy`` is not the code ``digest`` pins, in words naming what is in it
    that should not be ("" when it is that code, file for file). Named as others know the path (``anchor.shown``)."""
    why = _copy_problem(copy, digest)
    return why.replace(str(copy), anchor.shown(copy)) if why else ""


def _copy_problem(copy: Path, digest: str) -> str:
    if not copy.is_dir():
        return f"the copy of the trainer's code ({copy}) is missing"
    files, others = _whole(copy)
    if others:
        return f"the copy of the trainer's code ({copy}) holds {others[0]}, which is not a regular file"
    if _digest(files) == digest:
        return ""
    sources = {rel for rel, _ in _tree_files(copy)}
    extra = [rel for rel, _ in files if rel not in sources]  # bytecode, caches, hidden files: never part of a copy
    if extra and _digest([(rel, f) for rel, f in files if rel in sources]) == digest:
        return f"the copy of the trainer's code ({copy}) holds {extra[0]}, which is not in its digest (bytecode or a file added after it froze)"
    return f"the copy of the trainer's code ({copy}) is not the code the contract pins ({digest})"


def check_copy(search_dir: str | os.PathLike, identity: Mapping[str, Any]) -> None:
    """``reject:trainer`` unless the search's copy of the trainer's code is the code its contract pins, whole."""
    if identity.get("code") and (why := copy_problem(snapshot_dir(search_dir, str(identity["source_digest"])), str(identity["source_digest"]))):
        raise GovernanceRefusal(Outcome.reject("trainer"), f"{why}; nothing of it runs: move the copy's extra files aside, or start a new search.revision")


def copy_snapshot(source_dir: str | os.PathLike, dest_dir: str | os.PathLike, identity: Mapping[str, Any]) -> None:
    """The search's copy of the trainer's code, copied whole under ``dest_dir`` (a registry entry),
    checked against its digest: a released artifact then carries the code that serves it."""
    if not identity.get("code"):
        return
    dest = snapshot_dir(dest_dir, str(identity["source_digest"]))
    if not dest.is_dir():
        source = snapshot_dir(source_dir, str(identity["source_digest"]))
        _copy_whole(
            _tree_files(source), dest, str(identity["source_digest"]), f"the search's copy of the trainer's code ({source}) is not the code its contract pins"
        )


def copy_digest(search_dir: str | os.PathLike, identity: Mapping[str, Any]) -> str:
    """What the copy in the search holds now, every file of it (a worker's own observation, never the recorded value)."""
    dest = snapshot_dir(search_dir, str(identity["source_digest"]))
    return _copy_digest(dest) if dest.is_dir() else "missing"


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """A module of the copy compiled from its source every time: bytecode is neither read nor written."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)

    def set_data(self, path: str, data: Any, *, _mode: int = 0o666) -> None:
        pass  # never a cache file in the copy


_LOADERS = [(importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES), (_SourceLoader, importlib.machinery.SOURCE_SUFFIXES)]


class _CopyFinder(importlib.abc.MetaPathFinder):
    """Finds the copy's packages (``tops``: their top-level names) in the copy and nowhere else: first
    on ``sys.meta_path``, so a working directory, a checkout or another copy on ``sys.path`` never
    shadows them, and with no bytecode loader (an extension module is a file of the digested copy)."""

    def __init__(self, copy: Path, tops: frozenset[str]) -> None:
        self.copy, self.tops = copy, tops

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.tops:
            return None
        places = [str(self.copy)] if "." not in fullname else [p for p in (path or []) if Path(p).is_relative_to(self.copy)]
        for place in places:
            spec = importlib.machinery.FileFinder(place, *_LOADERS).find_spec(fullname)
            if spec is not None and (spec.loader is not None or spec.submodule_search_locations):
                return spec
        raise ModuleNotFoundError(f"{fullname} is not in the trainer's code copy {self.copy}", name=fullname)


def import_from_copy(search_dir: str | os.PathLike, identity: Mapping[str, Any]) -> Any:
    """The trainer's module, imported from the search's copy once the copy is checked whole against
    its digest (``UsageError`` naming what is wrong, before anything of it is imported). Modules of
    the same names imported from elsewhere first (a working tree) are dropped, and from then on this
    process finds those packages only in the copy (``_CopyFinder``)."""
    target = str(identity["target"])
    module_name = target.partition(":")[0]
    if not identity.get("code"):
        return importlib.import_module(module_name)
    dest = snapshot_dir(search_dir, str(identity["source_digest"]))
    why = copy_problem(dest, str(identity["source_digest"]))
    if why:
        raise UsageError(f"trainer.target={target}: {why}; nothing of it was imported")
    names = list(identity["code"])
    for loaded in list(sys.modules):
        mod = sys.modules[loaded]
        if any(loaded == n or loaded.startswith(n + ".") or n.startswith(loaded + ".") for n in names) and not _inside(mod, dest):
            del sys.modules[loaded]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _CopyFinder)]
    sys.meta_path.insert(0, _CopyFinder(dest, frozenset(n.split(".")[0] for n in names)))
    importlib.invalidate_caches()
    module = importlib.import_module(module_name)
    if not _inside(module, dest):
        raise UsageError(
            f"trainer.target={target}: {module_name} imported from {getattr(module, '__file__', '?')}, not from the search's copy {anchor.shown(dest)}"
        )
    return module


def _inside(module: Any, top: Path) -> bool:
    file = getattr(module, "__file__", None)
    if file:
        return Path(file).resolve().is_relative_to(top.resolve())
    return all(Path(p).resolve().is_relative_to(top.resolve()) for p in getattr(module, "__path__", []))


def distributions(roots: Sequence[CodeRoot], module: Any) -> dict[str, str]:
    """The installed third-party distributions the trainer's code imports, with their versions:
    read from its import statements (lazy ones inside functions included), so what a trainer
    imports only in ``build`` counts too. Standard library and the trainer's own packages left out.
    A package it imports that no distribution provides is working-tree code the search would not
    copy: ``UsageError`` naming it and ``trainer.code``."""
    own = {r.module.split(".")[0] for r in roots} | {_TOOLKIT}
    files = [f for r in roots for _, f in r.files() if f.suffix == ".py"] or [Path(inspect.getfile(module))]
    out: dict[str, str] = {}
    for name in sorted(_imported(files)):
        top = name.split(".")[0]
        if top in own or top in sys.stdlib_module_names:
            continue
        dists = _packages().get(top, [])
        if len(dists) > 1:  # a namespace shared by several (google.*): the one that holds this module
            dists = _owners(name, dists) or dists
        if not dists:
            _refuse_uncopied(top)
        for dist in dists:
            out[dist] = installed_version(dist)
    return dict(sorted(out.items()))


def _imported(files: Sequence[Path]) -> set[str]:
    names: set[str] = set()
    for file in files:
        try:
            tree = ast.parse(file.read_bytes(), filename=str(file))
        except SyntaxError:
            continue  # it did import: a file it never imports may be anything
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return names


def _owners(name: str, dists: Sequence[str]) -> list[str]:
    """The distributions among ``dists`` whose files hold module ``name`` ([] when it cannot be told)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is None:
        return []
    found = []
    for dist in dists:
        for file in metadata.distribution(dist).files or []:
            if Path(str(file.locate())).resolve() == origin:
                found.append(dist)
                break
    return found


def _refuse_uncopied(top: str) -> None:
    """An importable package no distribution provides (one on PYTHONPATH, a checkout) would run from
    the working tree, unpinned: it must be copied with the trainer. One not importable here is an
    optional import the code guards; it is nothing to pin."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    where = spec.origin or next(iter(spec.submodule_search_locations or []), "?")
    raise UsageError(
        f"the trainer's code imports {top} (from {where}), which no installed distribution provides, so the search would run it from "
        f"the working tree unpinned; add trainer.code=[{top}] to copy it with the trainer, or pip install it"
    )


@cache
def _packages() -> Mapping[str, list[str]]:
    """Each top-level module and the distributions that provide it, as
    ``metadata.packages_distributions()`` gives them (a distribution's ``top_level.txt``, else the
    ``.py`` files its RECORD lists), read without what made that 0.18 s of CPU of every launch here
    (0.05 s now): the email parser over each whole METADATA for its name, and a path object for
    every installed file."""
    out: defaultdict[str, list[str]] = defaultdict(list)
    for dist in metadata.distributions():
        name = name_and_version(dist)[0]
        for top in (dist.read_text("top_level.txt") or "").split() or _inferred_tops(dist):
            out[top].append(name)  # type: ignore[arg-type]  # None where a distribution has no Name, as the stdlib's
    return dict(out)


def _inferred_tops(dist: metadata.Distribution) -> set[str]:
    """The top-level names of a distribution's ``.py`` files: a file's first folder, or its stem."""
    record = dist.read_text("RECORD")
    if not record:  # an egg-info install: its files as the standard library lists them
        paths = [str(f) for f in dist.files or []]
    else:
        paths = [row[0] for row in csv.reader(record.splitlines()) if row]
    tops = set()
    for path in paths:
        if "/./" in path or "//" in path or path.startswith(("/", "./")) or path.endswith(("/", "/.")):
            parts = PurePosixPath(path).parts  # the rare path a plain split would read otherwise
        else:
            parts = tuple(path.split("/"))
        if parts and parts[-1].endswith(".py") and parts[-1] != ".py":
            tops.add(parts[0] if len(parts) > 1 else parts[0][: -len(".py")])
    return tops


def installed_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"
