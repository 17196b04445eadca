"""Tests for parcel_hpc.sbatch: rendering the reviewable templates, refusing smuggled values,
writing scripts, and the sbatch argv/parser.

Golden files: each template is rendered with fixed values and compared byte for byte with
tests/golden/<name>.sbatch. After a deliberate template change, rewrite them with
    PARCEL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_sbatch.py -k golden
and review the diff (it is exactly what an admin will see change).

The rendered scripts are also run for real: `bash -n` for syntax, and whole scripts with a fake
interpreter (and fake squeue/sbatch for the reconcile chain) to check what actually gets executed.
The slurm-marked tests at the end submit to the dev cluster named by SLURM_CONF.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parcel_hpc.errors import ParcelError, SchedulerUnavailable, UsageError
from parcel_hpc.sbatch import (
    MAX_TIME_MIN,
    SCRIPT_MODE,
    TEMPLATES_DIR,
    SbatchValues,
    format_time_limit,
    parse_sbatch_output,
    render,
    submit,
    submit_argv,
    template_header_count,
    write_script,
)

GOLDEN_DIR = Path(__file__).parent / "golden"
TEMPLATES = ("winner_rerun", "final_eval", "reconcile")
OPTIONAL = {"account", "qos", "wckey", "error", "signal", "gpus", "extra_env"}  # fields whose line is dropped when empty

SEARCH = "/shared/parcel/searches/damage-v3"
BASE = dict(
    partition="gpu-low",
    python="/opt/parcel/venv/bin/python",
    search_dir=SEARCH,
    search_revision="r7",
    contract_digest="sha256:5f0c9e1d2b3a4c5d",
)
GOLDEN_VALUES = {
    # Every optional field set: the fullest script.
    "winner_rerun": SbatchValues(
        job_name="parcel-winner-rerun", time_limit_min=240, mem="16G", cpus_per_task=8, gpus=1,
        output=f"{SEARCH}/logs/winner-%j.out", error=f"{SEARCH}/logs/winner-%j.err",
        account="vision", qos="normal", wckey="parcel", signal="B:USR2@120", requeue=True,
        extra_env={"OMP_NUM_THREADS": "8", "HYDRA_FULL_ERROR": "1"}, **BASE,
    ),
    # qos, wckey, error, signal and extra_env empty: their lines are gone.
    "final_eval": SbatchValues(
        job_name="parcel-final-eval", time_limit_min=1500, mem="32G", cpus_per_task=4, gpus=1,
        output=f"{SEARCH}/logs/final-eval-%j.out", account="vision", **BASE,
    ),
    "reconcile": SbatchValues(
        job_name="parcel-reconcile", time_limit_min=15, mem="1G",
        output=f"{SEARCH}/accounting/reconcile-%j.json", error=f"{SEARCH}/accounting/reconcile-%j.err",
        reconcile_every_min=60, **BASE,
    ),
}


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


def assert_same_structure(name: str, script: str) -> None:
    """Every rendered line is one template line with its placeholders filled in, in template order;
    only lines holding an optional field are missing. So no value added a line or a directive."""
    assert "\r" not in script and "\0" not in script
    rendered = script.split("\n")
    assert rendered[-1] == ""  # ends with exactly one newline
    rendered = rendered[:-1]
    tpl = template_lines(name)
    assert len(rendered) <= len(tpl)
    assert sum(line.startswith("#SBATCH") for line in rendered) <= template_header_count(name)
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
    assert template_header_count(name) >= 10
    assert render(f"{name}.sbatch", GOLDEN_VALUES[name]) == render(name, GOLDEN_VALUES[name])


def test_optional_lines_are_dropped_and_kept() -> None:
    full = render("winner_rerun", GOLDEN_VALUES["winner_rerun"])
    for opt in ("--account=vision", "--qos=normal", "--wckey=parcel", "--gres=gpu:1", "--signal=B:USR2@120",
                f"--error={SEARCH}/logs/winner-%j.err", "export HYDRA_FULL_ERROR=1 OMP_NUM_THREADS=8"):
        assert opt in full
    bare = render("winner_rerun", values())
    for gone in ("#SBATCH --account", "#SBATCH --qos", "#SBATCH --wckey", "#SBATCH --gres", "#SBATCH --signal",
                 "#SBATCH --error", "\nexport "):
        assert gone in full and gone not in bare
    assert "#SBATCH --no-requeue" in bare and "#SBATCH --requeue" in full
    assert full.count("\n") - bare.count("\n") == 7
    assert_same_structure("winner_rerun", bare)
    bash_n(bare)


@pytest.mark.parametrize(
    ("minutes", "text"),
    [(1, "00:01:00"), (59, "00:59:00"), (60, "01:00:00"), (90, "01:30:00"), (1439, "23:59:00"),
     (1440, "1-00:00:00"), (1500, "1-01:00:00"), (MAX_TIME_MIN, "366-00:00:00")],
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
    ("job_name", "a" * 65),
    ("job_name", "-x"),
    ("job_name", "x\u2028#SBATCH --uid=0"),
    ("job_name", "x#SBATCH"),
    ("partition", "low --account=root"),
    ("partition", "low\t--account=root"),
    ("partition", ""),
    ("account", "root\0"),
    ("account", "a'b"),
    ("qos", "high\n"),
    ("wckey", "k#x"),
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
    ("signal", "B:USR2@120\n#SBATCH --uid=0"),
    ("signal", "KILL"),
    ("signal", "B:USR2@99999"),
    ("signal", "B:99"),
    ("cpus_per_task", 0),
    ("cpus_per_task", True),
    ("cpus_per_task", "8"),
    ("gpus", -1),
    ("gpus", 65),
    ("time_limit_min", 0),
    ("requeue", "yes"),
    ("reconcile_every_min", -1),
    ("extra_env", {"A\nB": "x"}),
    ("extra_env", {"LD_PRELOAD": "/tmp/x.so"}),
    ("extra_env", {"SLURM_CONF": "/etc/slurm/slurm.conf"}),
    ("extra_env", {"BASH_FUNC_x%%": "() { id; }"}),
    ("extra_env", {"X": "a\nb"}),
    ("extra_env", {"X": "#SBATCH --uid=0"}),
    ("extra_env", {"1X": "a"}),
    ("extra_env", "X=1"),
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
    assert "#SBATCH --output=/srv/logs/%x-%A_%a.out\n" in render("final_eval", v)


def test_values_are_frozen_and_env_normalised() -> None:
    v = values(extra_env=[("B", "2"), ("A", "1")])
    assert v.extra_env == (("A", "1"), ("B", "2"))
    assert v == values(extra_env={"A": "1", "B": "2"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.job_name = "other"  # type: ignore[misc]
    with pytest.raises(UsageError, match="twice"):
        values(extra_env=[("A", "1"), ("A", "2")])


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
        ("#SBATCH ${extra_env}\n", "cannot go in an #SBATCH line"),
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


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [("final_eval", "requeue", True), ("final_eval", "signal", "B:USR2@60"), ("reconcile", "gpus", 1),
     ("winner_rerun", "reconcile_every_min", 60)],
)
def test_value_the_template_ignores_raises(name: str, field: str, value: object) -> None:
    v = values(reconcile_every_min=0) if name == "reconcile" else values()
    with pytest.raises(UsageError, match=f"does not use {field}"):
        render(name, dataclasses.replace(v, **{field: value}))


@pytest.mark.parametrize("name", ["../etc/passwd", "winner_rerun/../x", "nope", "", "Winner"])
def test_unknown_template_name_raises(name: str) -> None:
    with pytest.raises(UsageError, match="template"):
        render(name, values())


def test_shell_dollars_in_templates_are_left_alone(tmp_path: Path) -> None:
    d = write_template(tmp_path, "t", "#SBATCH --job-name=${job_name}\necho $0 ${SLURM_JOB_ID} $(id -u) $HOME ${search_dir}\n")
    assert render("t", values(), templates_dir=d).splitlines()[-1] == f"echo $0 ${{SLURM_JOB_ID}} $(id -u) $HOME {SEARCH}"


# ---------------------------------------------------------------- properties

STRING_FIELDS = ("job_name", "partition", "account", "qos", "wckey", "output", "error", "python",
                 "search_dir", "search_revision", "contract_digest", "mem", "signal")
NASTY = ["a", "Z9", "/", "/tmp", ".", "-", "_", "%j", "\n", "\r", "\0", "\t", " ", "#SBATCH", "#", " --uid=0",
         "$(", ")", "`", ";", "'", '"', "\\", "\u2028", "\x85", "\u00a0", "..", "B:USR2@1", "4G", ":"]
nasty_text = st.lists(st.sampled_from(NASTY), max_size=8).map("".join)
safe_text = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
# Mostly hostile, partly valid (bare or as /path), so both the refusal and the rendering side are exercised.
any_value = st.one_of(st.text(max_size=80), nasty_text, nasty_text.map(lambda s: "/" + s),
                      safe_text, safe_text.map(lambda s: "/srv/" + s), st.tuples(safe_text, nasty_text).map("".join))


def render_all(v: SbatchValues) -> dict[str, str]:
    out = {}
    for name in TEMPLATES:
        kw = {}
        if name != "winner_rerun":
            kw = dict(requeue=False, signal="") if name == "final_eval" else dict(requeue=False, signal="", gpus=0)
        r = dataclasses.replace(v, reconcile_every_min=5 if name == "reconcile" else None, **kw)
        out[name] = render(name, r)
    return out


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
@given(field=st.sampled_from(("job_name", "partition", "account", "search_dir", "output")),
       value=st.from_regex(r"/?[A-Za-z0-9][A-Za-z0-9._/+,@=%-]{0,30}", fullmatch=True))
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
    fake.write_text(
        "#!/bin/bash\n"
        'printf "%s\\0" "$@" > "$PROBE_DIR/argv"\n'
        'printf "%s" "${PROBE-unset}" > "$PROBE_DIR/probe"\n'
        "echo '{\"reconciled\": true}'\n"
    )
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.text(max_size=40), nasty_text))
def test_extra_env_value_reaches_the_job_verbatim(tmp_path: Path, value: str) -> None:
    try:
        v = values(extra_env={"PROBE": value}, python=str(fake_interpreter(tmp_path)))
    except UsageError as exc:
        assert "extra_env" in str(exc)
        return
    marker = tmp_path / "pwned"
    proc = run_script(tmp_path, render("final_eval", v))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "probe").read_bytes().decode() == value
    assert not marker.exists()


@pytest.mark.parametrize("name", TEMPLATES)
def test_script_runs_the_named_command_with_exact_argv(tmp_path: Path, name: str) -> None:
    search = tmp_path / "search"
    payload = f"$(touch {tmp_path}/pwned)`touch {tmp_path}/pwned2`'\"\\"
    v = values(python=str(fake_interpreter(tmp_path)), search_dir=str(search), extra_env={"PROBE": payload},
               reconcile_every_min=0 if name == "reconcile" else None)
    proc = run_script(tmp_path, render(name, v))
    assert proc.returncode == 0, proc.stderr
    cmd = {"winner_rerun": ["rerun-winner", str(search)], "final_eval": ["final-eval", str(search)],
           "reconcile": ["reconcile", str(search), "--json"]}[name]
    assert recorded_argv(tmp_path) == ["-m", "parcel_hpc", *cmd]
    assert (tmp_path / "probe").read_text() == payload
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def fake_slurm_bin(tmp_path: Path, *, pending: str = "", sbatch_rc: int = 0) -> Path:
    """squeue/sbatch stand-ins for the reconcile chain; sbatch records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$*\" > \"$PROBE_DIR/squeue\"\necho -n '{pending}'\n")
    (bin_dir / "sbatch").write_text(
        f"#!/bin/bash\nprintf '%s\\0' \"$@\" > \"$PROBE_DIR/sbatch\"\n"
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
    script = render("final_eval", GOLDEN_VALUES["final_eval"])
    path = write_script(tmp_path / "final_eval.sbatch", script)
    assert path.read_bytes() == script.encode()
    assert stat.S_IMODE(path.stat().st_mode) == SCRIPT_MODE == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["final_eval.sbatch"]  # no temp file left


@pytest.mark.parametrize(("path", "text"), [("rel.sbatch", "#!/bin/bash\n"), ("/tmp/x y.sbatch", "#!/bin/bash\n"),
                                            (None, "echo no shebang\n"), (None, "#!/bin/bash\nno newline"), (None, "#!/bin/bash\n\0\n")])
def test_write_script_refuses(tmp_path: Path, path: str | None, text: str) -> None:
    with pytest.raises(UsageError):
        write_script(path or tmp_path / "s.sbatch", text)


# ---------------------------------------------------------------- sbatch argv and output


def test_submit_argv() -> None:
    assert submit_argv("/srv/s/final_eval.sbatch") == ["sbatch", "--parsable", "/srv/s/final_eval.sbatch"]
    assert submit_argv(Path("/srv/s/x.sbatch"), parsable=False) == ["sbatch", "/srv/s/x.sbatch"]
    for bad in ("x.sbatch", "/srv/a b.sbatch", "/srv/x\n.sbatch", "--uid=0"):
        with pytest.raises(UsageError, match="script path"):
            submit_argv(bad)


@pytest.mark.parametrize(
    ("text", "job_id"),
    [("23\n", "23"), ("23;parcel\n", "23"), ("Submitted batch job 18\n", "18"),
     ("Submitted batch job 18 on cluster parcel\n", "18"),
     ("sbatch: warning: can't honor --ntasks-per-node set to 4\n1234\n", "1234")],
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
    "sbatch: error: invalid partition specified: nosuch\n"
    "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
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
    script = write_script(tmp_path / "s.sbatch", render("final_eval", values()))
    bin_dir = fake_slurm_bin(tmp_path)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PROBE_DIR": str(tmp_path)}
    assert submit(script, env=env) == "4242"
    assert (tmp_path / "sbatch").read_bytes().decode().split("\0")[:-1] == ["--parsable", str(script)]


def test_submit_failures(tmp_path: Path) -> None:
    script = write_script(tmp_path / "s.sbatch", render("final_eval", values()))
    bin_dir = fake_slurm_bin(tmp_path, sbatch_rc=1)
    with pytest.raises(SchedulerUnavailable):
        submit(script, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "PROBE_DIR": str(tmp_path)})
    with pytest.raises(SchedulerUnavailable, match="not on PATH"):
        submit(script, env={"PATH": str(tmp_path / "empty")})


def test_render_refuses_non_values() -> None:
    with pytest.raises(UsageError, match="SbatchValues"):
        render("final_eval", {"job_name": "x"})  # type: ignore[arg-type]
    assert issubclass(UsageError, ParcelError)


# ---------------------------------------------------------------- the real cluster

needs_slurm = pytest.mark.skipif(
    not os.environ.get("SLURM_CONF"), reason="SLURM_CONF is not set: start scripts/dev-cluster-up.sh and source its env.sh"
)
CLUSTER_WAIT_S = 60  # a job starts about 1 s after sbatch on the dev cluster


def cluster_values(tmp_path: Path, name: str, python: Path, **kw) -> SbatchValues:
    base = dict(job_name=f"sbatch-test-{name}", partition="low", time_limit_min=2, mem="100M",
                output=f"{tmp_path}/{name}-%j.out", python=str(python), search_dir=str(tmp_path),
                search_revision="r1", contract_digest="sha256:abc")
    base.update(kw)
    return SbatchValues(**base)


@pytest.mark.slurm
@needs_slurm
@pytest.mark.parametrize("name", TEMPLATES)
def test_sbatch_accepts_rendered_headers(tmp_path: Path, name: str) -> None:
    kw = {"winner_rerun": dict(gpus=1, signal="B:USR2@30", requeue=True, account="parcel", wckey="parcel"),
          "final_eval": dict(gpus=1, account="parcel"), "reconcile": dict(reconcile_every_min=60, account="parcel")}[name]
    script = write_script(tmp_path / f"{name}.sbatch", render(name, cluster_values(tmp_path, name, fake_interpreter(tmp_path), **kw)))
    proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr and "partition low" in proc.stderr


def wait_for(path: Path, text: str) -> str:
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while time.monotonic() < deadline:
        got = path.read_text() if path.exists() else ""
        if text in got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} after {CLUSTER_WAIT_S} s: {got!r}")


@pytest.mark.slurm
@needs_slurm
def test_batch_signal_reaches_the_interpreter(tmp_path: Path) -> None:
    """winner_rerun execs the interpreter, so a B: signal (here sent at once with scancel -b) lands in
    the process that checkpoints; under a bash parent USR2 would kill bash instead."""
    fake = tmp_path / "trapper"
    fake.write_text(
        "#!/bin/bash\n"
        "trap 'echo \"got USR2 pid=$$\"; exit 0' USR2\n"
        "echo \"started pid=$$ job=$SLURM_JOB_ID argv=$*\"\n"
        "while true; do sleep 0.2; done\n"
    )
    fake.chmod(0o755)
    v = cluster_values(tmp_path, "usr2", fake, gpus=1, signal="B:USR2@30", requeue=True)
    job_id = submit(write_script(tmp_path / "winner_rerun.sbatch", render("winner_rerun", v)))
    out = tmp_path / f"usr2-{job_id}.out"
    try:
        started = wait_for(out, "started")
        assert f"job={job_id} argv=-m parcel_hpc rerun-winner {tmp_path}" in started
        subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30)
        wait_for(out, "got USR2")
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=30)
