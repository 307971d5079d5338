"""The CLI never loses a user's file, exits honestly, and cleans up (issue 18, "Outputs").

* a failing command leaves every earlier file as it was (bad plot path, a failing second
  output, a failing rename) and no temp file;
* files are written before anything is printed, so ``| head -1`` never costs a file;
* bad output paths fail before any work, naming the user's path and the real cause;
* SIGINT, SIGTERM and SIGHUP exit 130 with a message, after the solver (CBC) was killed and
  its temp files removed;
* non-finite option values are one-line errors (exit 2).

Commands run in real subprocesses where the process boundary matters (pipes, signals) and in
forked children of this process (the real ``ecal.cli.main``, a fault injected) elsewhere.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from ecal import cli
from ecal.output import OutputPathError, Outputs, check_output_dir, check_output_path
from tests.procs import alive, children

ROOT = Path(__file__).resolve().parents[1]
PIPE = str(ROOT / "ecal" / "examples" / "pipeline_4x8.csv")
LINUX = sys.platform.startswith("linux")
EARLIER = '{"earlier": "content a user keeps"}\n'


# -- helpers -----------------------------------------------------------------------------------

def env_for(tmp: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    if tmp is not None:
        env.update(TMPDIR=str(tmp), TMP=str(tmp), TEMP=str(tmp))
    return env


def ecal_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ecal", *args]


def forked(argv: list[str], cwd: Path, inject: Callable[[], None] | None = None
           ) -> tuple[int, str, str]:
    """Run ``ecal.cli.main(argv)`` in a forked child (in ``cwd``, after ``inject()``); returns
    (exit code, stdout, stderr). The captured streams live outside ``cwd``."""
    io_dir = cwd.parent / f".io-{cwd.name}"
    io_dir.mkdir(exist_ok=True)
    out, err = io_dir / "out", io_dir / "err"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.chdir(cwd)
            sys.stdout = open(out, "w")
            sys.stderr = open(err, "w")
            if inject is not None:
                inject()
            code = cli.main(argv)
        except SystemExit as exc:     # argparse's own errors
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.read_text(), err.read_text()


def one_line_error(code: int, err: str, *needles: str) -> str:
    assert code == 2, (code, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("ecal ") and ": error: " in lines[0], lines[0]
    assert ".tmp." not in lines[0] and ".bak." not in lines[0], lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def listing(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` with its content (to show nothing was added, removed or changed)."""
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(d.rglob("*"))}


def seeded(d: Path, *names: str) -> dict[str, bytes]:
    for n in names:
        (d / n).write_text(EARLIER)
    return listing(d)


# -- Outputs.commit: all or nothing -------------------------------------------------------------

def test_commit_failing_second_output_keeps_every_earlier_file(tmp_path):
    before = seeded(tmp_path, "a.json", "b.json")
    out = Outputs()
    out.json(tmp_path / "a.json", {"new": 1})

    def fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", tmp)

    out.custom(tmp_path / "b.json", fail)
    out.json(tmp_path / "c.json", {"new": 3})
    with pytest.raises(OSError) as ei:
        out.commit()
    assert ei.value.filename == str(tmp_path / "b.json")    # the user's path, not the temp
    assert listing(tmp_path) == before


def test_commit_failure_removes_folders_it_created_and_names_user_path(tmp_path):
    out = Outputs()
    out.text(tmp_path / "new" / "deep" / "a.txt", "x")

    def fail(tmp: str) -> None:
        raise ValueError(f"cannot encode {tmp}")

    out.custom(tmp_path / "new" / "b.png", fail)
    with pytest.raises(OutputPathError) as ei:
        out.commit()
    assert str(tmp_path / "new" / "b.png") in str(ei.value) and ".tmp." not in str(ei.value)
    assert listing(tmp_path) == {}


def test_commit_failing_rename_puts_replaced_files_back(tmp_path, monkeypatch):
    before = seeded(tmp_path, "a.json", "b.json")
    out = Outputs()
    for n in ("a.json", "b.json", "c.json"):
        out.json(tmp_path / n, {"new": n})
    real = os.replace

    def replace(src, dst):
        if Path(dst).name == "c.json":
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        out.commit()
    monkeypatch.setattr(os, "replace", real)
    assert listing(tmp_path) == before       # a and b back as they were, c not created


def test_commit_replaces_and_leaves_no_temp_or_backup(tmp_path):
    seeded(tmp_path, "a.json")
    out = Outputs()
    out.json(tmp_path / "a.json", {"new": 1})
    out.text(tmp_path / "sub" / "b.txt", "b\n")
    assert out.commit() == [tmp_path / "a.json", tmp_path / "sub" / "b.txt"]
    assert json.loads((tmp_path / "a.json").read_text()) == {"new": 1}
    assert sorted(listing(tmp_path)) == ["a.json", "sub", "sub/b.txt"]


# -- output paths checked before any work --------------------------------------------------------

def test_check_output_path_cases(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output_path(tmp_path, "-o")
    with pytest.raises(OutputPathError, match="is not a folder"):
        check_output_path(tmp_path / "file" / "x.json", "-o")
    with pytest.raises(OutputPathError, match="is not a folder"):
        check_output_dir(tmp_path / "file", "--out")
    assert check_output_path(tmp_path / "a" / "b" / "x.json") == tmp_path / "a" / "b" / "x.json"
    check_output_dir(tmp_path / "d")
    assert sorted(listing(tmp_path)) == ["file"]          # the checks created nothing


CASES = [
    (["plan", PIPE, "--deadline", "1.05x", "-o", "plan.json", "--plot", "/proc/x.png"],
     "/proc/x.png", "does not accept new files"),
    (["plan", PIPE, "--deadline", "1.05x", "-o", "plan.json", "--schedule", "sub"], "sub", "is a folder"),
    (["plan", PIPE, "--deadline", "1.05x", "-o", "plan.json/x.json"], "plan.json/x.json", "not a folder"),
    (["plan", PIPE, "--deadline", "1.05x", "-o", "plan.json", "--schedule", "./plan.json"],
     "./plan.json", "both"),
    (["pareto", PIPE, "--plot", "p.xyz"], "p.xyz", "image format"),
    (["characterize", "copy_2GiB", "-o", "sub"], "sub", "is a folder"),
    (["characterize", "copy_2GiB", "-o", "c.json", "--plot", "plan.json/c.png"], "plan.json/c.png",
     "not a folder"),
    (["frontier", "plan.json", "--plot", "sub"], "sub", "is a folder"),
    (["import", "h200", "plan.json", "-o", "sub"], "sub", "is a folder"),
    (["demo", "--out", "plan.json"], "plan.json", "not a folder"),
    (["demo", "--out", "/proc/demo"], "/proc/demo", "does not accept new files"),
]


@pytest.mark.parametrize("argv,path,cause", CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES])
def test_bad_output_path_fails_before_work_naming_the_users_path(tmp_path, argv, path, cause):
    if path.startswith("/proc") and not (LINUX and os.path.isdir("/proc/self")):
        pytest.skip("needs Linux /proc")
    work = tmp_path / "w"
    work.mkdir()
    (work / "sub").mkdir()
    before = seeded(work, "plan.json")
    code, _, err = forked(argv, work)
    # one stderr line: no progress line of the demo or the sweep was printed, so no work ran
    line = one_line_error(code, err, f" {path}", cause)
    assert "cannot write" in line or "both name" in line
    assert listing(work) == before


def test_earlier_file_survives_bad_plot_path_in_a_real_process(tmp_path):
    before = seeded(tmp_path, "plan.json")
    r = subprocess.run(ecal_cmd("plan", PIPE, "--deadline", "1.05x", "-o", "plan.json", "--plot",
                                str(tmp_path / "plan.json" / "x.png")),
                       cwd=tmp_path, env=env_for(), capture_output=True, text=True, timeout=120)
    one_line_error(r.returncode, r.stderr, "plan.json/x.png")
    assert listing(tmp_path) == before


def _fail_plot(*_args, **_kw):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_failing_last_output_of_plan_keeps_earlier_files(tmp_path):
    before = seeded(tmp_path, "plan.json", "sched.json", "plan.png")

    def inject() -> None:
        import solvers.plot

        solvers.plot.plot_timeline = _fail_plot

    code, out, err = forked(["plan", PIPE, "--deadline", "1.05x", "-o", "plan.json", "--schedule",
                             "sched.json", "--plot", "plan.png"], tmp_path, inject)
    one_line_error(code, err, "plan.png", "No space left")
    assert out == ""                                  # nothing printed: nothing was written
    assert listing(tmp_path) == before


def test_failing_figure_of_frontier_names_the_user_path(tmp_path):
    code, _, err = forked(["characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980:1380:-300",
                           "-o", "c.json", "--json"], tmp_path)
    assert code == 0, err
    before = seeded(tmp_path, "f.json", "f.png")

    def inject() -> None:
        import matplotlib.figure

        def savefig(self, fname, *a, **kw):
            Path(fname).write_text("partial")
            raise OSError(errno.EDQUOT, "Disk quota exceeded", str(fname))

        matplotlib.figure.Figure.savefig = savefig

    code, _, err = forked(["frontier", "c.json", "-o", "f.json", "--plot", "f.png"], tmp_path, inject)
    one_line_error(code, err, "f.png", "Disk quota exceeded")
    assert listing(tmp_path) == before


def test_failing_rename_in_a_command_puts_earlier_files_back(tmp_path):
    before = seeded(tmp_path, "plan.json", "sched.json")

    def inject() -> None:
        real = os.replace

        def replace(src, dst):
            if Path(dst).name == "sched.json" and ".tmp." in Path(src).name:
                raise OSError(errno.EIO, "Input/output error")
            return real(src, dst)

        os.replace = replace

    code, _, err = forked(["plan", PIPE, "--deadline", "1.05x", "-o", "plan.json", "--schedule",
                           "sched.json"], tmp_path, inject)
    one_line_error(code, err, "sched.json", "Input/output error")
    assert listing(tmp_path) == before


# -- stdout closed early: files still written, exit 0 ---------------------------------------------

def _closed_pipe_run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader is already gone (every write fails)."""
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    try:
        return subprocess.run(ecal_cmd(*argv), cwd=cwd, env=env_for(), stdout=w_fd,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w_fd)


@pytest.mark.parametrize("argv", [
    ["plan", PIPE, "--deadline", "1.05x", "-o", "x.json", "--json"],
    ["characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980:1380:-300", "-o", "x.json"],
], ids=["plan", "characterize"])
def test_closed_stdout_still_writes_the_files(tmp_path, argv):
    # deterministic: every write to stdout fails, from the first one
    r = _closed_pipe_run(argv, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    assert json.loads((tmp_path / "x.json").read_text())


def test_closed_stdout_and_stderr_still_write_the_files(tmp_path):
    # `2>&1 | head`: the sweep's progress lines (stderr) fail too; the work must go on
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    try:
        r = subprocess.run(ecal_cmd("characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980:1380:-300",
                                    "-o", "x.json", "--plot", "x.png"), cwd=tmp_path, env=env_for(),
                           stdout=w_fd, stderr=w_fd, timeout=120)
    finally:
        os.close(w_fd)
    assert r.returncode == 0
    assert json.loads((tmp_path / "x.json").read_text())
    assert (tmp_path / "x.png").stat().st_size > 1000


@pytest.mark.parametrize("rep", range(3))
def test_head_1_still_writes_the_files(tmp_path, rep):
    # the case: `ecal plan ... -o X | head -1`, through a real shell pipeline
    seeded(tmp_path, "x.json")
    cmd = " ".join(f"'{a}'" for a in ecal_cmd("plan", PIPE, "--deadline", "1.05x", "-o", "x.json",
                                              "--schedule", "s.json", "--json"))
    r = subprocess.run(["bash", "-c", f'{cmd} | head -1; echo "ecal-rc=${{PIPESTATUS[0]}}" >&2'],
                       cwd=tmp_path, env=env_for(), capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "{"
    assert "ecal-rc=0" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    assert "makespan_s" in json.loads((tmp_path / "x.json").read_text())
    assert json.loads((tmp_path / "s.json").read_text())


# -- signals --------------------------------------------------------------------------------------

def _default_signals() -> None:  # pragma: no cover - runs in the child before exec
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)


def _cbc_available() -> bool:
    try:
        from solvers.ilp import available_solvers
    except ImportError:  # pragma: no cover
        return False
    return any(s in ("PULP_CBC_CMD", "COIN_CMD") for s in available_solvers())


@pytest.mark.skipif(not LINUX, reason="finds the CBC child through /proc (Linux)")
@pytest.mark.skipif(not _cbc_available(), reason="CBC is not installed (pulp[cbc])")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_interrupt_during_cbc_exits_130_kills_cbc_and_removes_its_files(tmp_path, sig):
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    work = tmp_path / "w"
    work.mkdir()
    before = seeded(work, "plan.json")
    # 4x4 1F1B with switch costs: CBC needs tens of seconds to prove it optimal (measured
    # ~25 s on 2 cores); the signal is sent as soon as the CBC process exists.
    p = subprocess.Popen(ecal_cmd("plan", PIPE, "--microbatches", "4", "--deadline", "1.1x",
                                  "--transition-time-s", "0.001", "--transition-energy-j", "1",
                                  "--method", "ilp", "--time-limit-s", "600", "-o", "plan.json"),
                         cwd=work, env=env_for(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_default_signals)
    cbc: list[tuple[int, str]] = []
    try:
        give_up = time.monotonic() + 240      # only a guard against a hang, not a speed check
        while p.poll() is None and time.monotonic() < give_up:
            cbc = [c for c in children(p.pid) if "cbc" in c[1]]
            if cbc:
                break
            time.sleep(0.02)
        assert cbc, ("CBC never started", p.poll(), p.stderr.read() if p.poll() is not None else "")
        assert str(tmp) in cbc[0][1]                  # its files are in the test's TMPDIR
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=120)
        assert p.returncode == 130, err
        assert f"ecal: interrupted ({sig})" in err
        assert not any(alive(pid) for pid, _ in cbc), "CBC left running"
        assert list(tmp.iterdir()) == []               # no *-pulp.mps / .sol, no sandbox folder
        assert listing(work) == before
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid, _ in cbc:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_and_sighup_raise_and_previous_handlers_come_back(tmp_path, monkeypatch):
    from ecal import commands

    seen = {}

    def sentinel(signum, frame):  # pragma: no cover - never called
        pass

    def fake(args):
        seen.update({s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)                          # interrupted at once by the handler's exception
        return 0

    old_term = signal.signal(signal.SIGTERM, sentinel)
    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)    # as under nohup
    monkeypatch.setattr(commands, "cmd_compose", fake)
    try:
        code = cli.main(["compose", "x.json"])
        assert code == 130
        assert seen[signal.SIGTERM] is cli._raise_interrupted
        assert seen[signal.SIGHUP] == signal.SIG_IGN       # an ignored signal stays ignored
        assert signal.getsignal(signal.SIGTERM) is sentinel   # restored on return of main()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_runs_finally_blocks_then_exits_130(tmp_path, sig):
    marker = tmp_path / "finally-ran"

    def inject() -> None:
        from ecal import commands

        def slow(args):
            try:
                os.kill(os.getpid(), getattr(signal, sig))
                time.sleep(30)
            finally:
                marker.write_text("yes")
            return 0

        commands.cmd_compose = slow

    code, _, err = forked(["compose", "x.json"], tmp_path, inject)
    assert code == 130, err
    assert err.strip() == f"ecal: interrupted ({sig})"
    assert marker.read_text() == "yes"


# -- non-finite option values ---------------------------------------------------------------------

NAN_CASES = [   # (arguments, the option the error must name)
    (["plan", PIPE, "--deadline", "1.05x", "--transition-time-s", "nan"], "--transition-time-s"),
    (["plan", PIPE, "--deadline", "1.05x", "--transition-time-s", "inf"], "--transition-time-s"),
    (["plan", PIPE, "--deadline", "1.05x", "--transition-energy-j", "nan"], "--transition-energy-j"),
    (["plan", PIPE, "--deadline", "1.05x", "--p2p-power-w", "nan"], "--p2p-power-w"),
    (["plan", PIPE, "--deadline", "1.05x", "--time-limit-s", "nan"], "--time-limit-s"),
    (["pareto", PIPE, "--transition-energy-j=-inf"], "--transition-energy-j"),
    (["compose", PIPE, "--alpha", "nan"], "--alpha"),
    (["check", PIPE, "--alpha", "inf"], "--alpha"),
    (["characterize", "copy_2GiB", "--target-rse", "nan"], "--target-rse"),
]


@pytest.mark.parametrize("argv,option", NAN_CASES,
                         ids=[f"{a[0]} {' '.join(a[3:])}" for a, _ in NAN_CASES])
def test_non_finite_option_is_a_one_line_error(tmp_path, argv, option):
    outputs = ["-o", "x.json"] if argv[0] in ("plan", "pareto") else []
    code, out, err = forked(argv + outputs, tmp_path)
    one_line_error(code, err, option, "finite")
    assert out == "" and listing(tmp_path) == {}


def test_other_bad_numbers_are_one_line_errors(tmp_path):
    code, _, err = forked(["plan", PIPE, "--deadline", "1.05x", "--p2p-power-w", "-5"], tmp_path)
    one_line_error(code, err, "--p2p-power-w")
    code, _, err = forked(["characterize", "copy_2GiB", "--target-rse", "0"], tmp_path)
    one_line_error(code, err, "--target-rse")


# -- ecal restore ---------------------------------------------------------------------------------

def test_restore_is_a_command():
    ap = cli.build_parser()
    args = ap.parse_args(["restore", "--device", "nvml:1", "--json"])
    assert (args.command, args.device, args.json) == ("restore", "nvml:1", True)
    assert "put back GPU settings a killed run left changed" in ap.format_help()


def test_restore_runs_recovery(tmp_path, monkeypatch):
    recovery = pytest.importorskip("ecal.recovery", reason="ecal/recovery.py is not written yet")
    calls = []
    monkeypatch.setattr(recovery, "cmd_restore", lambda args, nvml=None: calls.append(args) or 0)
    assert cli.main(["restore", "--device", "nvml:0"]) == 0
    assert calls and calls[0].device == "nvml:0"


# -- special files, links, the results path and the user's own work (acceptance pass) -------

EXAMPLE = str(Path(__file__).resolve().parents[1] / "ecal" / "examples" / "pipeline_4x8.csv")


def test_output_onto_a_fifo_is_refused_and_the_fifo_stays(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rc = cli.main(["plan", EXAMPLE, "--deadline", "1.05x", "-o", str(fifo)])
    err = capsys.readouterr().err
    assert rc == 2 and "not a regular file" in err and str(fifo) in err
    assert fifo.is_fifo()          # replacing it would turn it into a plain file
    with pytest.raises(OutputPathError, match="not a regular file"):
        check_output_path(fifo, "-o")


def test_output_through_a_symlink_updates_the_file_it_names(tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text("{}\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert cli.main(["plan", EXAMPLE, "--deadline", "1.05x", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(real.read_text())["problem"].startswith("pipeline_4x8")


def test_unwritable_results_path_names_it_and_the_cause(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = cli.main(["characterize", "gemm_bf16_8192", "--grid", "sm_clock_mhz=1980",
                   "--results", str(blocker / "r.jsonl")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0
    assert f"--results {blocker / 'r.jsonl'}" in err and "not a folder" in err and ".lock" not in err


def test_the_users_failing_work_exits_3_with_its_traceback(tmp_path, monkeypatch, capsys):
    from fake_pynvml import make_fake_pynvml

    import measure.nvml as mn

    (tmp_path / "mywork.py").write_text(
        "def bad():\n    raise ValueError('shape mismatch in my kernel')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = make_fake_pynvml()
    monkeypatch.setattr(mn, "_load_pynvml", lambda: fake)
    rc = cli.main(["characterize", "mywork:bad", "--device", "nvml:0", "--grid",
                   "sm_clock_mhz=1980,1500"])
    err = capsys.readouterr().err
    # not 2 ("bad input": it would hide the traceback) and not 1 ("check flagged")
    assert rc == 3
    assert "Traceback" in err and "mywork.py" in err
    assert "your work mywork:bad raised ValueError: shape mismatch in my kernel" in err
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == fake.gpu.default_limit_mw
