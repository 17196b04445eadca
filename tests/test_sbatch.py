"""Tests for parcel_hpc.scheduler.slurm.sbatch: rendering the reviewable templates, refusing smuggled values,
writing scripts, and the sbatch argv/parser; and for `parcel-hpc schedule-reconcile`, which renders
and submits sbatch_templates/reconcile.sbatch.

Golden files: each template is rendered with fixed values and compared byte for byte with
tests/golden/<name>.sbatch. After a deliberate template change, rewrite them with
    PARCEL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_sbatch.py -k golden
and review the diff (it is exactly what an admin will see change).

The rendered scripts are also run for real: `bash -n` for syntax, and whole scripts with a fake
interpreter (and fake squeue/sbatch for the reconcile chain) to check what actually gets executed.
The slurm-marked test at the end submits to the dev cluster named by SLURM_CONF; the command's run on
the cluster is in tests/slurm/test_schedule_reconcile.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parcel_hpc.errors import ParcelError, SchedulerUnavailable, UsageError
from parcel_hpc.governance.contract import Contract, freeze_contract
from parcel_hpc.governance.validation import MAX_TIME_MIN
from parcel_hpc.scheduler.slurm.sbatch import (
    SCRIPT_MODE,
    TEMPLATES_DIR,
    SbatchValues,
    format_time_limit,
    parse_sbatch_output,
    render,
    submit,
    submit_argv,
    write_script,
)
from parcel_hpc.testing import parcel_hpc

GOLDEN_DIR = Path(__file__).parent / "golden"
# Every template in sbatch_templates/: a new one needs golden values below and an existing command.
TEMPLATES = tuple(sorted(p.stem for p in TEMPLATES_DIR.glob("*.sbatch")))
OPTIONAL = {"partition", "account", "qos", "error", "gres"}  # fields whose line is dropped when empty

SEARCH = "/shared/parcel/searches/damage-v3"
BASE = dict(
    python="/opt/parcel/venv/bin/python",
    search_dir=SEARCH,
    search_revision="r7",
    contract_digest="sha256:5f0c9e1d2b3a4c5d",
    search_id="5f0c9e1d2b3a4c5d6e7f8091a2b3c4d5",
)
GOLDEN_VALUES = {
    # Every optional field set: the fullest script.
    "reconcile": SbatchValues(
        job_name="parcel-reconcile-r7-5f0c9e1d2b3a",
        partition="gpu-low",
        account="vision",
        qos="normal",
        time_limit_min=15,
        mem="1G",
        output=f"{SEARCH}/accounting/reconcile-%j.json",
        error=f"{SEARCH}/accounting/reconcile-%j.err",
        reconcile_every_min=60,
        **BASE,
    ),
    **{
        name: SbatchValues(
            job_name=f"parcel-r7-{role}-5f0c9e1d2b3a",
            partition="gpu-low",
            account="vision",
            qos="normal",
            time_limit_min=30,
            mem="4096M",
            cpus_per_task=2,
            gres="gpu:1",
            output=f"{SEARCH}/selection/1/logs/{role}-%j.out",
            selection=1,
            search_uid=1001,
            search_inode=4325377,
            **BASE,
        )
        for name, role in (("winner_rerun", "rerun"), ("final_eval", "final"))
    },
}
# What each template needs beyond values(), for tests that render every template.
OWNED = dict(selection=1, search_uid=1001, search_inode=4325377)  # a selection job holds the search to its owner and inode
NEEDS = {"reconcile": dict(reconcile_every_min=5), "winner_rerun": OWNED, "final_eval": OWNED}


def values(**overrides) -> SbatchValues:
    """Minimal valid values; a test overrides the field it is about."""
    kw = dict(job_name="job", time_limit_min=10, output="/tmp/out-%j.log", **BASE)
    kw.update(overrides)
    return SbatchValues(**kw)


def bash_n(script: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 0, proc.stderr


def template_lines(name: str) -> list[str]:
    return (TEMPLATES_DIR / f"{name}.sbatch").read_text().splitlines()


def header_count(name: str) -> int:
    return sum(line.startswith("#SBATCH") for line in template_lines(name))


def assert_same_structure(name: str, script: str) -> None:
    """Every rendered line is one template line with its placeholders filled in, in template order;
    only lines holding an optional field are missing. So no value added a line or a directive."""
    assert "\r" not in script and "\0" not in script
    rendered = script.split("\n")
    assert rendered[-1] == ""  # ends with exactly one newline
    rendered = rendered[:-1]
    tpl = template_lines(name)
    assert len(rendered) <= len(tpl)
    assert sum(line.startswith("#SBATCH") for line in rendered) <= header_count(name)
    pos = 0
    for line in rendered:
        while True:
            assert pos < len(tpl), f"rendered line {line!r} matches no template line"
            t = tpl[pos]
            pieces = re.split(r"(\$\{[a-z][a-z0-9_]*\})", t)
            pattern = "".join("[^\n]*" if p.startswith("${") else re.escape(p) for p in pieces)
            pos += 1
            if re.fullmatch(pattern, line):
                break
            names = set(re.findall(r"\$\{([a-z][a-z0-9_]*)\}", t))
            assert names & OPTIONAL, f"template line {t!r} was dropped but holds no optional field"


# ---------------------------------------------------------------- golden files


@pytest.mark.parametrize("name", TEMPLATES)
def test_golden(name: str) -> None:
    script = render(name, GOLDEN_VALUES[name])
    golden = GOLDEN_DIR / f"{name}.sbatch"
    if os.environ.get("PARCEL_UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_bytes(script.encode())
    assert script.encode() == golden.read_bytes()
    assert_same_structure(name, script)
    bash_n(script)


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_files_parse_and_have_directives(name: str) -> None:
    assert header_count(name) >= 10
    assert render(f"{name}.sbatch", GOLDEN_VALUES[name]) == render(name, GOLDEN_VALUES[name])


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_runs_an_existing_command(name: str) -> None:
    """A template may only name a parcel-hpc subcommand that exists (and has golden values)."""
    assert name in GOLDEN_VALUES and name in NEEDS
    commands = re.findall(r"-m parcel_hpc ([a-z][a-z-]*)", (TEMPLATES_DIR / f"{name}.sbatch").read_text())
    assert commands, f"{name}.sbatch runs no parcel_hpc command"
    for command in commands:
        res = parcel_hpc([command, "--help"], timeout=60)
        assert res.returncode == 0, f"{name}.sbatch runs `python -m parcel_hpc {command}`: {res.stderr}"


def test_optional_lines_are_dropped_and_kept() -> None:
    full = render("reconcile", GOLDEN_VALUES["reconcile"])
    for opt in ("--partition=gpu-low", "--account=vision", "--qos=normal", f"--error={SEARCH}/accounting/reconcile-%j.err"):
        assert opt in full
    bare = render("reconcile", values(reconcile_every_min=60))
    for gone in ("#SBATCH --partition", "#SBATCH --account", "#SBATCH --qos", "#SBATCH --error"):
        assert gone in full and gone not in bare
    assert full.count("\n") - bare.count("\n") == 4
    assert_same_structure("reconcile", bare)
    bash_n(bare)


@pytest.mark.parametrize(
    ("minutes", "text"),
    [
        (1, "00:01:00"),
        (59, "00:59:00"),
        (60, "01:00:00"),
        (90, "01:30:00"),
        (1439, "23:59:00"),
        (1440, "1-00:00:00"),
        (1500, "1-01:00:00"),
        (MAX_TIME_MIN, "366-00:00:00"),
    ],
)
def test_format_time_limit(minutes: int, text: str) -> None:
    assert format_time_limit(minutes) == text


@pytest.mark.parametrize("minutes", [0, -5, MAX_TIME_MIN + 1, 1.5, "60", True, None])
def test_format_time_limit_refuses(minutes: object) -> None:
    with pytest.raises(UsageError, match="time_limit_min"):
        format_time_limit(minutes)  # type: ignore[arg-type]


# ---------------------------------------------------------------- injection


INJECTIONS = [
    ("job_name", "x\n#SBATCH --uid=0"),
    ("job_name", "x\r#SBATCH --uid=0"),
    ("job_name", "a" * 129),
    ("job_name", "-x"),
    ("job_name", "x\u2028#SBATCH --uid=0"),
    ("job_name", "x#SBATCH"),
    ("partition", "low --account=root"),
    ("partition", "low\t--account=root"),
    ("partition", "low\n"),
    ("account", "root\0"),
    ("account", "a'b"),
    ("qos", "high\n"),
    ("qos", "k#x"),
    ("output", "/tmp/out\n#SBATCH --uid=0"),
    ("output", "relative/out.log"),
    ("output", "/tmp/a b.log"),
    ("output", "/tmp/\u00a0x"),
    ("error", "/tmp/err`id`"),
    ("error", "/tmp/#SBATCH"),
    ("search_dir", "/tmp/$(rm -rf /)"),
    ("search_dir", "/tmp/x;reboot"),
    ("search_dir", "/tmp/../etc"),
    ("search_dir", "/tmp/x/"),
    ("search_dir", "//tmp/x"),
    ("search_dir", "/tmp/%j"),
    ("search_dir", "/tmp/nul\0"),
    ("search_dir", "/" + "a" * 1100),
    ("python", "python3"),
    ("python", "/usr/bin/python3 -c 'import os'"),
    ("search_revision", "r1;id"),
    ("contract_digest", "sha256:ab cd"),
    ("contract_digest", ""),
    ("mem", "4G --uid=0"),
    ("mem", "0"),
    ("mem", "4GB"),
    ("cpus_per_task", 0),
    ("cpus_per_task", True),
    ("cpus_per_task", "8"),
    ("time_limit_min", 0),
    ("reconcile_every_min", -1),
    ("reconcile_every_min", "60"),
]


@pytest.mark.parametrize(("field", "bad"), INJECTIONS)
def test_bad_value_raises_usage_error_naming_field(field: str, bad: object) -> None:
    with pytest.raises(UsageError) as info:
        values(**{field: bad})
    msg = str(info.value)
    assert field in msg
    assert "\n" not in msg and "\r" not in msg and "\0" not in msg and len(msg) < 400
    assert "; " in msg  # the fix follows the problem
    if isinstance(bad, str) and bad:
        assert repr(bad)[:20] in msg  # the bad value, as repr, truncated


def test_long_value_is_truncated_in_message() -> None:
    with pytest.raises(UsageError) as info:
        values(job_name="x" * 500)
    assert "x" * 40 in str(info.value) and "x" * 100 not in str(info.value)


def test_paths_accept_pathlike_and_sbatch_patterns() -> None:
    v = values(search_dir=Path("/srv/s1"), output="/srv/logs/%x-%A_%a.out")
    assert v.search_dir == "/srv/s1" and isinstance(v.search_dir, str)
    assert "#SBATCH --output=/srv/logs/%x-%A_%a.out\n" in render("reconcile", dataclasses.replace(v, reconcile_every_min=0))


def test_values_are_frozen() -> None:
    v = values()
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.job_name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------- template rules


def write_template(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / f"{name}.sbatch").write_text("#!/bin/bash\n" + body)
    return tmp_path


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("#SBATCH --job-name=${nope}\n", r"\$\{nope\}, which is not a field"),
        ("#SBATCH --account=${account} --qos=${qos}\n", "mixes optional"),
        ("#SBATCH --job-name=${job_name}\necho hi\n#SBATCH --uid=0\n", "after the first command"),
        ("#SBATCH --x=1\necho '#SBATCH --uid=0'\n", "at the start of the line"),
        ("#SBATCH --x=1\necho no-newline", "end with a newline"),
    ],
)
def test_bad_template_raises(tmp_path: Path, body: str, match: str) -> None:
    d = write_template(tmp_path, "bad", body)
    with pytest.raises(UsageError, match=match):
        render("bad", values(), templates_dir=d)


def test_missing_field_raises() -> None:
    # reconcile.sbatch needs reconcile_every_min: no silently empty "EVERY_MIN=" line.
    with pytest.raises(UsageError, match="reconcile_every_min, which is not set"):
        render("reconcile", values())


@pytest.mark.parametrize(("field", "value"), [("account", "vision"), ("partition", "low"), ("reconcile_every_min", 60)])
def test_value_the_template_ignores_raises(tmp_path: Path, field: str, value: object) -> None:
    d = write_template(tmp_path, "t", "#SBATCH --job-name=${job_name}\n#SBATCH --qos=${qos}\necho ${search_dir}\n")
    assert render("t", values(qos="normal"), templates_dir=d)
    with pytest.raises(UsageError, match=f"does not use {field}"):
        render("t", values(**{field: value}), templates_dir=d)


@pytest.mark.parametrize("name", ["../etc/passwd", "reconcile/../x", "nope", "", "Reconcile", "winner-rerun", "final_eval.sh"])
def test_unknown_template_name_raises(name: str) -> None:
    with pytest.raises(UsageError, match="template"):
        render(name, values())


def test_shell_dollars_in_templates_are_left_alone(tmp_path: Path) -> None:
    d = write_template(tmp_path, "t", "#SBATCH --job-name=${job_name}\necho $0 ${SLURM_JOB_ID} $(id -u) $HOME ${search_dir}\n")
    assert render("t", values(), templates_dir=d).splitlines()[-1] == f"echo $0 ${{SLURM_JOB_ID}} $(id -u) $HOME {SEARCH}"


# ---------------------------------------------------------------- properties

STRING_FIELDS = ("job_name", "partition", "account", "qos", "output", "error", "python", "search_dir", "search_revision", "contract_digest", "mem")
NASTY = [
    "a",
    "Z9",
    "/",
    "/tmp",
    ".",
    "-",
    "_",
    "%j",
    "\n",
    "\r",
    "\0",
    "\t",
    " ",
    "#SBATCH",
    "#",
    " --uid=0",
    "$(",
    ")",
    "`",
    ";",
    "'",
    '"',
    "\\",
    "\u2028",
    "\x85",
    "\u00a0",
    "..",
    "B:USR2@1",
    "4G",
    ":",
]
nasty_text = st.lists(st.sampled_from(NASTY), max_size=8).map("".join)
safe_text = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
# Mostly hostile, partly valid (bare or as /path), so both the refusal and the rendering side are exercised.
any_value = st.one_of(
    st.text(max_size=80),
    nasty_text,
    nasty_text.map(lambda s: "/" + s),
    safe_text,
    safe_text.map(lambda s: "/srv/" + s),
    st.tuples(safe_text, nasty_text).map("".join),
)


def render_all(v: SbatchValues) -> dict[str, str]:
    return {name: render(name, dataclasses.replace(v, **NEEDS[name])) for name in TEMPLATES}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(STRING_FIELDS), value=any_value)
def test_no_value_adds_a_line_or_directive(field: str, value: str) -> None:
    try:
        v = values(**{field: value})
    except UsageError as exc:
        assert field in str(exc) and "\n" not in str(exc)
        return
    for name, script in render_all(v).items():
        assert_same_structure(name, script)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(("job_name", "partition", "account", "search_dir", "output")),
    value=st.from_regex(r"/?[A-Za-z0-9][A-Za-z0-9._/+,@=%-]{0,30}", fullmatch=True),
)
def test_accepted_values_render_valid_bash(field: str, value: str) -> None:
    try:
        v = values(**{field: value})
    except UsageError:
        return
    for name, script in render_all(v).items():
        assert_same_structure(name, script)
        bash_n(script)


def fake_interpreter(tmp_path: Path) -> Path:
    """Stands in for python: records argv and one variable, prints a JSON line on stdout."""
    fake = tmp_path / "fakepy"
    fake.write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$PROBE_DIR/argv"\nprintf "%s" "${PROBE-unset}" > "$PROBE_DIR/probe"\necho \'{"reconciled": true}\'\n')
    fake.chmod(0o755)
    return fake


def run_script(tmp_path: Path, script: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    path = write_script(tmp_path / "job.sbatch", script)
    env = {"PATH": os.environ["PATH"], "PROBE_DIR": str(tmp_path), "SLURM_JOB_NAME": "job"}
    if extra_path:
        env["PATH"] = f"{extra_path}:{env['PATH']}"
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, timeout=20, check=False)


def recorded_argv(tmp_path: Path) -> list[str]:
    return (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]


def test_reconcile_runs_the_command_with_exact_argv(tmp_path: Path) -> None:
    search = tmp_path / "search"
    v = values(python=str(fake_interpreter(tmp_path)), search_dir=str(search), reconcile_every_min=0)
    proc = run_script(tmp_path, render("reconcile", v))
    assert proc.returncode == 0, proc.stderr
    assert recorded_argv(tmp_path) == ["-m", "parcel_hpc", "reconcile", str(search), "--json"]


def fake_slurm_bin(tmp_path: Path, *, pending: str = "", sbatch_rc: int = 0) -> Path:
    """squeue/sbatch stand-ins for the reconcile chain; sbatch records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$*\" > \"$PROBE_DIR/squeue\"\necho -n '{pending}'\n")
    (bin_dir / "sbatch").write_text(
        '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$PROBE_DIR/sbatch"\n'
        + ("echo 4242\n" if sbatch_rc == 0 else f"echo 'sbatch: error: Unable to contact slurm controller' >&2\nexit {sbatch_rc}\n")
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def reconcile_values(tmp_path: Path, every: int) -> SbatchValues:
    return values(python=str(fake_interpreter(tmp_path)), search_dir=str(tmp_path), reconcile_every_min=every)


def test_reconcile_queues_its_successor_and_keeps_stdout_json(tmp_path: Path) -> None:
    proc = run_script(tmp_path, render("reconcile", reconcile_values(tmp_path, 45)), fake_slurm_bin(tmp_path))
    assert proc.returncode == 0, proc.stderr
    sbatch_argv = (tmp_path / "sbatch").read_bytes().decode().split("\0")[:-1]
    assert sbatch_argv == ["--parsable", "--begin=now+45minutes", "--dependency=singleton", str(tmp_path / "job.sbatch")]
    assert "--name=job" in (tmp_path / "squeue").read_text()
    assert json.loads(proc.stdout) == {"reconciled": True}  # the job id went to stderr
    assert "next reconcile is job 4242" in proc.stderr


def test_reconcile_skips_when_a_successor_is_pending(tmp_path: Path) -> None:
    proc = run_script(tmp_path, render("reconcile", reconcile_values(tmp_path, 45)), fake_slurm_bin(tmp_path, pending="77\n"))
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "sbatch").exists()
    assert recorded_argv(tmp_path)[2] == "reconcile"


def test_reconcile_still_runs_when_resubmission_fails(tmp_path: Path) -> None:
    proc = run_script(tmp_path, render("reconcile", reconcile_values(tmp_path, 45)), fake_slurm_bin(tmp_path, sbatch_rc=1))
    assert proc.returncode == 0
    assert "could not queue the next reconcile" in proc.stderr
    assert recorded_argv(tmp_path)[2] == "reconcile"


def test_reconcile_every_zero_never_calls_slurm(tmp_path: Path) -> None:
    proc = run_script(tmp_path, render("reconcile", reconcile_values(tmp_path, 0)), fake_slurm_bin(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "squeue").exists() and not (tmp_path / "sbatch").exists()


# ---------------------------------------------------------------- write_script


def test_write_script_mode_and_bytes(tmp_path: Path) -> None:
    script = render("reconcile", GOLDEN_VALUES["reconcile"])
    path = write_script(tmp_path / "reconcile.sbatch", script)
    assert path.read_bytes() == script.encode()
    assert stat.S_IMODE(path.stat().st_mode) == SCRIPT_MODE == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["reconcile.sbatch"]  # no temp file left


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("rel.sbatch", "#!/bin/bash\n"),
        ("/tmp/x y.sbatch", "#!/bin/bash\n"),
        (None, "echo no shebang\n"),
        (None, "#!/bin/bash\nno newline"),
        (None, "#!/bin/bash\n\0\n"),
    ],
)
def test_write_script_refuses(tmp_path: Path, path: str | None, text: str) -> None:
    with pytest.raises(UsageError):
        write_script(path or tmp_path / "s.sbatch", text)


# ---------------------------------------------------------------- sbatch argv and output


def test_submit_argv() -> None:
    assert submit_argv("/srv/s/reconcile.sbatch") == ["sbatch", "--parsable", "/srv/s/reconcile.sbatch"]
    assert submit_argv(Path("/srv/s/x.sbatch")) == ["sbatch", "--parsable", "/srv/s/x.sbatch"]
    for bad in ("x.sbatch", "/srv/a b.sbatch", "/srv/x\n.sbatch", "--uid=0"):
        with pytest.raises(UsageError, match="script path"):
            submit_argv(bad)


@pytest.mark.parametrize(
    ("text", "job_id"),
    [
        ("23\n", "23"),
        ("23;parcel\n", "23"),
        ("Submitted batch job 18\n", "18"),
        ("Submitted batch job 18 on cluster parcel\n", "18"),
        ("sbatch: warning: can't honor --ntasks-per-node set to 4\n1234\n", "1234"),
    ],
)
def test_parse_sbatch_output(text: str, job_id: str) -> None:
    assert parse_sbatch_output(text) == job_id


# Recorded from sbatch 22.05.8 against the dev cluster (stderr of failed submissions).
UNAVAILABLE = [
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
    "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "sbatch: error: fetch_config: DNS SRV lookup failed\n"
    "sbatch: error: _establish_config_source: failed to fetch config\n"
    "sbatch: fatal: Could not establish a configuration source\n",
]
REFUSED = [
    "sbatch: error: invalid partition specified: nosuch\nsbatch: error: Batch job submission failed: Invalid partition name specified\n",
    "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\n",
    "",
    "Submitted\n",
    "12\n13\n",
]


@pytest.mark.parametrize("text", UNAVAILABLE)
def test_parse_sbatch_unavailable(text: str) -> None:
    with pytest.raises(SchedulerUnavailable, match="SLURM_CONF"):
        parse_sbatch_output(text)


@pytest.mark.parametrize("text", REFUSED)
def test_parse_sbatch_refused(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_sbatch_output(text)
    assert not isinstance(info.value, SchedulerUnavailable)
    assert "\n" not in str(info.value)


def test_submit_runs_sbatch_from_path(tmp_path: Path) -> None:
    script = write_script(tmp_path / "s.sbatch", render("reconcile", values(reconcile_every_min=0)))
    bin_dir = fake_slurm_bin(tmp_path)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PROBE_DIR": str(tmp_path)}
    assert submit(script, env=env) == "4242"
    assert (tmp_path / "sbatch").read_bytes().decode().split("\0")[:-1] == ["--parsable", str(script)]


def test_submit_failures(tmp_path: Path) -> None:
    script = write_script(tmp_path / "s.sbatch", render("reconcile", values(reconcile_every_min=0)))
    bin_dir = fake_slurm_bin(tmp_path, sbatch_rc=1)
    with pytest.raises(SchedulerUnavailable):
        submit(script, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "PROBE_DIR": str(tmp_path)})
    with pytest.raises(SchedulerUnavailable, match="not on PATH"):
        submit(script, env={"PATH": str(tmp_path / "empty")})


def test_render_refuses_non_values() -> None:
    with pytest.raises(UsageError, match="SbatchValues"):
        render("reconcile", {"job_name": "x"})  # type: ignore[arg-type]
    assert issubclass(UsageError, ParcelError)


# ---------------------------------------------------------------- parcel-hpc schedule-reconcile


def make_search(tmp_path: Path, revision: str = "rev-a1") -> tuple[Path, Contract]:
    """A search directory that holds only its frozen contract: all schedule-reconcile reads."""
    fields = {
        "snapshot_digest": "sha256:aa",
        "split_digest": "sha256:bb",
        "metric_revision": "miss-cost-r3",
        "search_revision": revision,
        "image_digest": "sha256:cc",
    }
    contract, _ = freeze_contract(tmp_path / "runs" / revision, Contract(fields))
    return tmp_path / "runs" / revision, contract


def schedule(*args: str, env: dict[str, str] | None = None):
    return parcel_hpc(["schedule-reconcile", *args], env=env, timeout=60)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_schedule_reconcile_dry_run_prints_the_script_and_writes_nothing(tmp_path: Path) -> None:
    search, contract = make_search(tmp_path)
    before = tree(tmp_path)
    res = schedule(
        str(search),
        "--output-dir",
        str(tmp_path / "acct"),
        "--every-min",
        "30",
        "--partition",
        "low",
        "--account",
        "vision",
        "--time-limit-min",
        "20",
        "--mem",
        "2G",
        "--dry-run",
    )
    assert res.returncode == 0, res.stderr
    name = "parcel-reconcile-rev-a1"
    expected = SbatchValues(
        job_name=name,
        partition="low",
        account="vision",
        time_limit_min=20,
        mem="2G",
        output=f"{tmp_path}/acct/{name}-%j.json",
        error=f"{tmp_path}/acct/{name}-%j.err",
        python=sys.executable,
        search_dir=str(search),
        search_revision="rev-a1",
        contract_digest=contract.digest,
        search_id="none",
        reconcile_every_min=30,
    )
    assert res.stdout == render("reconcile", expected)
    assert f"--comment=parcel-hpc:search=none:revision=rev-a1:contract={contract.digest}\n" in res.stdout
    assert_same_structure("reconcile", res.stdout)
    bash_n(res.stdout)
    assert tree(tmp_path) == before  # no output dir, nothing in the search


def test_schedule_reconcile_defaults(tmp_path: Path) -> None:
    search, _ = make_search(tmp_path)
    res = schedule(str(search), "--output-dir", str(tmp_path / "acct"), "--dry-run")
    assert res.returncode == 0, res.stderr
    for line in ("#SBATCH --time=00:15:00", "#SBATCH --mem=1G", "EVERY_MIN=60"):
        assert line in res.stdout.splitlines()
    for gone in ("--partition", "--account", "--qos"):  # the cluster's and the user's defaults
        assert gone not in res.stdout


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--partition", "low --account=root"], "partition="),
        (["--partition", "low\n#SBATCH --uid=0"], "partition="),
        (["--account", "a\nb"], "account="),
        (["--qos", "high;id"], "qos="),
        (["--every-min", "-1"], "reconcile_every_min=-1 is out of range"),
        (["--time-limit-min", "0"], "time_limit_min=0"),
        (["--mem", "4GB"], "mem="),
        (["--output-dir", "/tmp/a b"], "output="),
        (["--every-min", "soon"], "invalid int value"),
    ],
)
def test_schedule_reconcile_bad_input(tmp_path: Path, args: list[str], match: str) -> None:
    search, _ = make_search(tmp_path)
    before = tree(tmp_path)
    res = schedule(str(search), "--output-dir", str(tmp_path / "acct"), *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout == "" and len(res.stderr.splitlines()) == 1
    assert res.stderr.startswith("error: ") and "; " in res.stderr and match in res.stderr
    assert tree(tmp_path) == before


def test_schedule_reconcile_refuses_a_missing_search(tmp_path: Path) -> None:
    res = schedule(str(tmp_path / "nope"), "--output-dir", str(tmp_path / "acct"))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: ") and "contract.json" in res.stderr and len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "acct").exists()


def test_schedule_reconcile_writes_and_submits(tmp_path: Path) -> None:
    search, _ = make_search(tmp_path)
    out = tmp_path / "acct"
    env = {"PATH": f"{fake_slurm_bin(tmp_path)}:{os.environ['PATH']}", "PROBE_DIR": str(tmp_path)}
    dry = schedule(str(search), "--output-dir", str(out), "--every-min", "0", "--dry-run")
    res = schedule(str(search), "--output-dir", str(out), "--every-min", "0", env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "4242\n"  # the job id alone: scripts can capture it
    script = out / "parcel-reconcile-rev-a1.sbatch"
    assert script.read_text() == dry.stdout
    assert stat.S_IMODE(script.stat().st_mode) == SCRIPT_MODE
    assert tree(out) == [script.name]
    assert (tmp_path / "sbatch").read_bytes().decode().split("\0")[:-1] == ["--parsable", str(script)]
    assert "scancel --name=parcel-reconcile-rev-a1" in res.stderr


def test_schedule_reconcile_without_slurm_is_one_line(tmp_path: Path) -> None:
    search, _ = make_search(tmp_path)
    env = {"PATH": f"{fake_slurm_bin(tmp_path, sbatch_rc=1)}:{os.environ['PATH']}", "PROBE_DIR": str(tmp_path)}
    res = schedule(str(search), "--output-dir", str(tmp_path / "acct"), env=env)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: sbatch could not reach Slurm") and len(res.stderr.splitlines()) == 1


# ---------------------------------------------------------------- the real cluster

needs_slurm = pytest.mark.skipif(not os.environ.get("SLURM_CONF"), reason="SLURM_CONF is not set: start scripts/dev-cluster-up.sh and source its env.sh")


def cluster_values(tmp_path: Path, name: str, python: Path, **kw) -> SbatchValues:
    base = dict(
        job_name=f"sbatch-test-{name}",
        partition="low",
        time_limit_min=2,
        mem="100M",
        output=f"{tmp_path}/{name}-%j.out",
        python=str(python),
        search_dir=str(tmp_path),
        search_revision="r1",
        contract_digest="sha256:abc",
        search_id="none",
    )
    base.update(kw)
    return SbatchValues(**base)


@pytest.mark.slurm
@needs_slurm
@pytest.mark.parametrize("name", TEMPLATES)
def test_sbatch_accepts_rendered_headers(tmp_path: Path, name: str) -> None:
    kw = {**NEEDS[name], "account": "parcel"}
    script = write_script(tmp_path / f"{name}.sbatch", render(name, cluster_values(tmp_path, name, fake_interpreter(tmp_path), **kw)))
    proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr and "partition low" in proc.stderr
