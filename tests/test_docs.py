"""Every code block of the user docs that shows code is run, in order, in a fresh directory: a
page either works as written or fails here."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parcel_hpc.ledger import SearchDir

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
FILE_HEADER = re.compile(r"# ([\w/]+\.(?:py|yaml))\n")
RUN_PAGES = ["bring-your-own-model.md", "search-space-and-samplers.md"]


def _tiny_logistic_completed(where: Path) -> None:
    records = list(SearchDir(where / "runs" / "tiny-logistic-r1").records())
    assert [r.state.value for r in records] == ["completed"] * 4 and len({r.metric for r in records}) > 1


def _tpe_replayed(where: Path) -> None:
    search = SearchDir(where / "runs" / "tpe-doc-r1")
    assert search.proposal_numbers() == list(range(8)) and all(r.state.is_finished() for r in search.records())


AFTERWARDS = {"bring-your-own-model.md": _tiny_logistic_completed, "search-space-and-samplers.md": _tpe_replayed}  # what the page's commands must have done


def blocks(page: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer((ROOT / "docs" / page).read_text())]


@pytest.mark.parametrize("page", RUN_PAGES)
def test_every_code_block_runs(page, tmp_path):
    found = blocks(page)
    assert found and all(lang in ("python", "bash", "yaml") for lang, _ in found), [lang for lang, _ in found]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARCEL_", "SLURM_"))}
    env |= {"PATH": f"{Path(sys.executable).parent}:{env['PATH']}", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    for lang, code in found:
        header = FILE_HEADER.match(code)
        if header:  # a file the page asks the reader to write
            (tmp_path / header.group(1)).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / header.group(1)).write_text(code)
            continue
        assert lang != "yaml", f"{page}: a yaml block must start with '# <path>.yaml', the file it is"
        argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{page} block failed:\n{code}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    AFTERWARDS[page](tmp_path)
