"""Library code logs (``logging.getLogger(__name__)``) and reports progress through one
protocol (:class:`measure.progress.ProgressEvent`); only the CLI writes to stderr.

* no module of frontier/, solvers/, measure/ or execution/ prints or touches ``sys.stderr``;
  the only direct writes are the documented lock-free ones of the restore path (a signal
  handler, interpreter exit);
* ``ecal``'s stderr lines are what they were (selftest stages, sweep points, the library's
  warnings as ``ecal: warning: ...``);
* the CLI's reporter draws a tqdm bar on a terminal and plain lines otherwise;
* ``ecal.cli.main`` installs one log handler and removes it when it returns.
"""

from __future__ import annotations

import ast
import io
import logging
import re
import sys
from pathlib import Path

from ecal import cli
from ecal.output import NOTE_LOGGERS, WARNING_LOGGERS, ProgressReporter, progress_reporter
from measure import SimulatedGPU, characterize, preset, sweep
from measure.progress import ProgressEvent

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("frontier", "solvers", "measure", "execution")

#: The one function that may write to file descriptor 2 itself (lock-free, see its docstring).
UNLOCKED_WRITER = ("measure/device.py", "write_stderr_unlocked")
#: Where it may be called: the restore path inside a signal handler or at interpreter exit.
UNLOCKED_CALLERS = {("measure/device.py", "_handler"), ("measure/device.py", "_at_exit"),
                    ("measure/nvml.py", "_report_journal"),
                    ("measure/nvml.py", "_restore_at_exit")}


def _library_files() -> list[Path]:
    return sorted(p for lib in LIBRARIES for p in (ROOT / lib).rglob("*.py"))


def _writes(path: Path) -> list[str]:
    """What in ``path`` writes to the terminal outside the documented places."""
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    found: list[str] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        where = f"{rel}:{getattr(node, 'lineno', '?')} in {func}"
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                found.append(f"{where}: print()")
            if isinstance(f, ast.Attribute) and f.attr == "write" and \
                    isinstance(f.value, ast.Name) and f.value.id == "os" and node.args and \
                    isinstance(node.args[0], ast.Constant) and node.args[0].value in (1, 2) and \
                    (rel, func) != UNLOCKED_WRITER:
                found.append(f"{where}: os.write({node.args[0].value}, ...)")
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == UNLOCKED_WRITER[1] and (rel, func) not in UNLOCKED_CALLERS:
                found.append(f"{where}: {name}() outside the signal/exit restore path")
        if isinstance(node, ast.Attribute) and node.attr in ("stderr", "__stderr__") and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            found.append(f"{where}: sys.{node.attr}")
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "<module>")
    return found


def test_no_library_module_prints():
    files = _library_files()
    assert len(files) > 50
    found = [w for p in files for w in _writes(p)]
    assert found == [], "library code logs (logging.getLogger(__name__)); only ecal prints:\n" \
        + "\n".join(found)


def test_the_ast_check_sees_what_it_forbids(tmp_path, monkeypatch):
    lib = tmp_path / "measure"
    lib.mkdir()
    (lib / "bad.py").write_text("import os, sys\n\ndef f():\n    print('x', file=sys.stderr)\n"
                                "    os.write(2, b'x')\n    write_stderr_unlocked('x')\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = _writes(lib / "bad.py")
    assert len(found) == 4 and all("measure/bad.py" in w for w in found), found


def test_library_loggers_have_no_handlers_outside_main():
    # a handler of the library's own (even a NullHandler) would hide warnings from a program
    # that configures nothing: Python's last-resort handler shows them only when none is found
    import execution  # noqa: F401 - every package imported
    import frontier  # noqa: F401
    import solvers  # noqa: F401

    for name in WARNING_LOGGERS:
        assert logging.getLogger(name).handlers == [], name


def test_long_operations_print_nothing_by_default(capsys):
    sweep(SimulatedGPU(), {None: preset("gemm_bf16_8192")}, "gemm", grid="sm_clock_mhz=1980,1500")
    assert capsys.readouterr() == ("", "")
    seen: list[ProgressEvent] = []
    sweep(SimulatedGPU(), {None: preset("gemm_bf16_8192")}, "gemm", grid="sm_clock_mhz=1980,1500",
          progress=seen.append)
    assert [(e.done, e.total, e.operation, e.measured) for e in seen] == \
        [(1, 2, "sweep", True), (2, 2, "sweep", True)]
    assert capsys.readouterr() == ("", "")


# -- the CLI's stderr ------------------------------------------------------------------------

POINT_LINE = re.compile(r"^\[\d/2\] gemm_bf16_8192 @ \S+ +measured  T=\S+ ms  E=\S+ J  eta (\d+ s|\?)$")


def test_characterize_stderr_lines_are_unchanged(capsys):
    assert cli.main(["characterize", "gemm_bf16_8192", "--grid", "sm_clock_mhz=1980,1500"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(POINT_LINE.match(ln) for ln in err), err
    assert err[0].startswith("[1/2] ") and err[1].startswith("[2/2] ") and "eta 0 s" in err[1]


def test_selftest_stderr_lines_are_unchanged(capsys):
    assert cli.main(["selftest", "--device", "sim"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"selftest: {s} ..." for s in (
        "counter_period", "counter_read_cost", "deep_idle_power", "ready_power",
        "sequential_composite", "sm_split_scaling")]


def test_a_library_warning_is_one_ecal_warning_line(capsys):
    # the sweep logs (measure.sweep) that the simulator grants SMs in steps of 8
    assert cli.main(["characterize", "gemm_bf16_8192", "--grid", "sm_count=66", "--json"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ecal: warning: simulated H200 grants SMs"), err
    assert "66 as 72" in err[0]


def test_the_handler_is_removed_when_main_returns(capsys, monkeypatch):
    from ecal import commands

    before = {n: list(logging.getLogger(n).handlers) for n in WARNING_LOGGERS}
    levels = {n: logging.getLogger(n).level for n in NOTE_LOGGERS}
    seen = []

    def logs(args) -> int:        # stands in for `ecal demo` (found by name in ecal.commands)
        seen.append({n: len(logging.getLogger(n).handlers) for n in WARNING_LOGGERS})
        logging.getLogger("measure.nvml").info("restored GPU-x (nvml:0): power limit 700 W")
        logging.getLogger("execution.runnable").info("not a note ecal shows")
        logging.getLogger("solvers.lns").warning("a warning")
        logging.getLogger("measure.device").error("restoring it failed")
        return 0

    monkeypatch.setattr(commands, "cmd_demo", logs)
    for _ in range(3):          # main runs many times in one process: one handler each time
        assert cli.main(["demo"]) == 0
        assert capsys.readouterr().err.splitlines() == [
            "ecal: restored GPU-x (nvml:0): power limit 700 W", "ecal: warning: a warning",
            "ecal: restoring it failed"]
        assert {n: list(logging.getLogger(n).handlers) for n in WARNING_LOGGERS} == before
        assert {n: logging.getLogger(n).level for n in NOTE_LOGGERS} == levels
    assert seen == [{n: len(before[n]) + 1 for n in WARNING_LOGGERS}] * 3


# -- the reporter ----------------------------------------------------------------------------

class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _events(total: int = 3) -> list[ProgressEvent]:
    return [ProgressEvent(i, total, f"gemm @ {1980 - 100 * i} MHz", 0.1 * i, 1.0, True,
                          operation="sweep") for i in range(1, total + 1)]


def test_the_reporter_draws_a_bar_on_a_terminal(monkeypatch):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    rep = progress_reporter()
    assert isinstance(rep, ProgressReporter) and rep.bar
    with rep:
        for e in _events():
            rep(e)
        rep(ProgressEvent(0, None, "stage", operation="demo", message="round 1: planning ..."))
    out = term.getvalue()
    assert "\r" in out and "3/3" in out and "sweep" in out      # tqdm's redrawn bar
    assert "round 1: planning ..." in out and "[1/3]" not in out
    assert not rep.drawing()


def test_the_reporter_writes_plain_lines_elsewhere(monkeypatch):
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    rep = progress_reporter()
    assert isinstance(rep, ProgressReporter) and not rep.bar
    events = _events() + [ProgressEvent(0, None, "x", message="selftest: ready_power ...")]
    for e in events:
        rep(e)
    assert pipe.getvalue() == "".join(e.line() + "\n" for e in events)
    assert "\r" not in pipe.getvalue()
    assert progress_reporter(enabled=False) is None


def test_the_reporter_goes_quiet_on_a_broken_pipe(monkeypatch):
    class Broken(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

        def fileno(self):
            raise OSError("no descriptor")

    monkeypatch.setattr(sys, "stderr", Broken())
    rep = progress_reporter()
    for e in _events():
        rep(e)                  # no exception: the work goes on


def test_an_event_is_the_line_it_prints():
    e = ProgressEvent(3, 12, "gemm @ 1500 MHz", 2.0, 6.0, False)
    assert str(e) == e.line() == f"[ 3/12] {'gemm @ 1500 MHz':<40} skipped  eta 6 s"
    assert ProgressEvent(1, 4, "u", status="failed").line().startswith("[1/4] u")
    assert "failed" in ProgressEvent(1, 4, "u", status="failed").line()


def test_the_unlocked_write_reaches_file_descriptor_2(capfd):
    from measure.device import write_stderr_unlocked

    write_stderr_unlocked("ecal: restoring X at exit failed: gone")
    assert capfd.readouterr().err == "ecal: restoring X at exit failed: gone\n"


def test_long_operations_default_to_no_progress():
    import inspect

    from ecal.demo import run_demo
    from measure import characterize_adaptive
    from measure.campaign import run_campaign
    from measure.joint import characterize_pairs
    from measure.selftest import run_selftest

    for fn in (sweep, characterize, characterize_pairs, characterize_adaptive, run_selftest,
               run_campaign, run_demo):
        assert inspect.signature(fn).parameters["progress"].default is None, fn.__name__
