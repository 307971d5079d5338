"""Campaigns on a shared, failing machine (issue 27): campaign files that try to run away (YAML
alias bombs, recursive aliases, deep nesting, duplicate keys, huge numbers and ranges) are
refused at once with one short line; the Ray amdsmi work-around writes nothing and loads
nothing from the state folder; a SIGKILLed campaign driver leaves no process behind."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frontier.errors import FormatError
from measure import campaign as C
from measure.campaign import CampaignError, load_campaign, parse_campaign, shard

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = {"window_s": 0.1, "warmup_s": 0.0, "min_windows": 2, "max_windows": 4,
            "ready_window_s": 0.2, "ready_windows": 1, "target_rse": 0.05}


def refused(path, match=None):
    """load_campaign(path) raises a FormatError; its one-line message (asserted short and
    naming the file). No wall-clock bound: on a loaded 2-core machine a refusal took 1.8 s
    where it takes a fraction of that quiet, and speed is for experiments/, not the suite."""
    with pytest.raises(FormatError) as e:
        load_campaign(path)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400, msg
    assert msg.startswith(str(path)), msg
    if match:
        assert match in msg, msg
    return msg


def bomb(levels, leaf='"lol"', fan=9, where="seed"):
    """A billion-laughs YAML campaign of ``levels`` levels, the last one used as ``where``."""
    lines = ["name: bomb", "elements: [copy_2GiB]", f"{where}:",
             f"  - &l0 [{', '.join([leaf] * fan)}]"]
    lines += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels)]
    if where == "name":
        lines = lines[1:]
    return "\n".join(lines) + "\n"


# -- YAML that cannot run away ----------------------------------------------------------------

@pytest.mark.parametrize("levels", [7, 9, 30])
def test_a_yaml_alias_bomb_is_refused_at_once_in_one_short_line(tmp_path, levels):
    f = tmp_path / "bomb.yaml"
    f.write_text(bomb(levels))
    assert len(f.read_bytes()) < 2000 + 40 * levels
    msg = refused(f, "expands to more than 200,000 values")
    assert "bomb.yaml: line " in msg and "lol" not in msg


def test_a_bomb_of_long_strings_is_refused_by_its_characters(tmp_path):
    f = tmp_path / "chars.yaml"
    f.write_text(bomb(4, leaf='"' + "x" * 5000 + '"', fan=8, where="name"))
    refused(f, "expands to more than 2,097,152 characters")


def test_a_bomb_within_the_limits_is_never_printed_whole(tmp_path):
    # 6 levels x 6 = 46,656 leaves: allowed by the reader, refused by the field check, whose
    # message quotes only a short piece of the value
    f = tmp_path / "small-bomb.yaml"
    f.write_text(bomb(6, fan=6))
    msg = refused(f, "seed: must be an integer, got [['lol', ")
    assert msg.count("lol") <= 8
    for where in ("device", "format", "store", "max_retries", "name"):
        f.write_text(bomb(6, fan=6, where=where))
        msg = refused(f)
        assert msg.count("lol") <= 8, msg


def test_a_recursive_alias_is_refused(tmp_path):
    f = tmp_path / "rec.yaml"
    f.write_text("name: r\nelements: [copy_2GiB]\nseed: &s [1, [*s]]\n")
    refused(f, "rec.yaml: line 3: a YAML alias refers to a value that contains it")


def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path):
    f = tmp_path / "deep.yaml"
    f.write_text("name: d\nelements: [copy_2GiB]\nseed: " + "[" * 50_000 + "]" * 50_000 + "\n")
    refused(f, "deep.yaml: line 3: nested deeper than 100 levels")


def test_duplicate_keys_are_refused_naming_the_key_and_both_lines(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("name: d\nelements: [copy_2GiB]\ngrid: 'sm_clock_mhz=1980'\nseed: 1\n"
                 "grid: 'sm_clock_mhz=1380'\n")
    refused(f, "dup.yaml: line 5: key 'grid' given twice (first at line 3)")
    f.write_text("name: d\nelements:\n  - name: att\n    kappas:\n      a: attention_flash\n"
                 "      a: attention_cudnn\n")
    refused(f, "dup.yaml: line 6: key 'a' given twice (first at line 5)")


def test_shared_anchors_and_merge_keys_are_still_accepted(tmp_path):
    f = tmp_path / "anchors.yaml"
    f.write_text(
        "name: a\n"
        "protocol: &p {window_s: 0.1, warmup_s: 0.0, min_windows: 2, max_windows: 4}\n"
        "grid: &g 'sm_clock_mhz=1980,1380'\n"
        "elements:\n"
        "  - {name: one, work: copy_2GiB, grid: *g}\n"
        "  - name: two\n"
        "    kappas: &k {flash: attention_flash, cudnn: attention_cudnn}\n"
        "  - name: three\n"
        "    kappas:\n"
        "      <<: *k\n"
        "      flash: attention_cudnn\n")
    spec = load_campaign(f)
    assert spec.protocol.window_s == 0.1 and len(shard(spec)) == 2 + 4 + 4
    assert dict(spec.elements[2].works) == {"flash": "attention_cudnn", "cudnn": "attention_cudnn"}


@pytest.mark.parametrize("value, why", [
    (".nan", "is not a finite 64-bit float"),
    ("-.inf", "is not a finite 64-bit float"),
    ("1.0e+999", "is not a finite 64-bit float"),
    ("1" + "0" * 400, "integer of 401 digits overflows"),
    ("2" + "0" * 308, "overflows a 64-bit float"),
])
def test_numbers_that_are_not_finite_floats_are_refused(tmp_path, value, why):
    f = tmp_path / "n.yaml"
    f.write_text(f"name: n\nelements: [copy_2GiB]\nprotocol:\n  window_s: {value}\n")
    refused(f, "n.yaml: line 4: ")
    assert why in str(pytest.raises(FormatError, load_campaign, f).value)


def test_json_campaigns_go_through_the_strict_json_reader(tmp_path):
    doc = {"name": "j", "elements": ["copy_2GiB"], "grid": "sm_clock_mhz=1980",
           "protocol": dict(PROTOCOL)}
    f = tmp_path / "c.json"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())        # a BOM is fine
    assert load_campaign(f).name == "j"
    f.write_text(json.dumps(doc).replace('"window_s": 0.1', '"window_s": NaN'))
    refused(f, "protocol.window_s: number NaN")
    f.write_text(json.dumps(doc).replace('"window_s": 0.1', '"window_s": 1e400'))
    refused(f, "overflows a 64-bit float")
    f.write_text('{"name": "deep", "seed": ' + "[" * 5000 + "]" * 5000 + "}")
    refused(f, "nested")
    f.write_bytes(b"\x00\x01" * 10)
    refused(f, "binary")


def test_oversized_files_ranges_and_campaigns_are_refused_before_allocating(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("name: big\nelements: [copy_2GiB]\n# " + "x" * C.MAX_CAMPAIGN_BYTES + "\n")
    refused(f, "a campaign file may hold at most")
    f = tmp_path / "range.yaml"
    f.write_text("name: r\nelements: [copy_2GiB]\ngrid: 'sm_clock_mhz=1:1e12:1'\n")
    refused(f, "range.yaml: grid: range sm_clock_mhz=1:1e12:1 has more than 100,000 values")
    els = [{"name": f"e{i}", "work": "copy_2GiB"} for i in range(2000)]
    with pytest.raises(FormatError, match="more than 100,000 units"):
        parse_campaign({"elements": els, "grid": "sm_clock_mhz=1980:1000:-10"}, "c.json")
    with pytest.raises(FormatError, match="name: must be a non-empty string of at most 256"):
        parse_campaign({"name": "n" * 10_000, "elements": ["copy_2GiB"]}, "c.json")


def test_keys_of_mixed_types_are_one_line_not_a_type_error(tmp_path):
    f = tmp_path / "mixed.yaml"
    f.write_text("name: m\nelements: [copy_2GiB]\n1: 2\nzzz: 3\n")
    refused(f, "mixed.yaml: 1: unknown field")


def test_the_cli_prints_one_line_and_exits_2_for_a_bomb(tmp_path, capsys):
    from ecal.cli import main

    f = tmp_path / "bomb.yaml"
    f.write_text(bomb(9))
    t0 = time.perf_counter()
    assert main(["campaign", str(f), "--quiet"]) == 2
    assert time.perf_counter() - t0 < 1.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400, err
    assert not (tmp_path / "bomb.sqlite").exists()


# -- no code from the state folder ----------------------------------------------------------------

class _FakeRay:
    """Records what ray.init was given and the environment Ray's processes would inherit."""

    def __init__(self):
        self.calls = []

    def is_initialized(self):
        return False

    def init(self, *args, **kwargs):
        self.calls.append((args, kwargs, dict(os.environ)))


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*")) \
        if Path(folder).exists() else []


def test_the_amdsmi_work_around_writes_nothing_and_loads_nothing_from_the_state_folder(
        tmp_path, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("ECAL_STATE_DIR", str(state))
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    # what a hostile user planted where the old work-around wrote its shim
    planted = state / "ray-amdsmi-shim" / "amdsmi"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("raise SystemExit('planted code ran')\n")
    before = _files(state)
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "amdsmi", sys.modules.get("amdsmi"))   # restored after
    monkeypatch.delitem(sys.modules, "amdsmi")
    monkeypatch.setattr(C, "_amdsmi_broken", lambda: True)
    assert C.connect_ray("local", num_gpus=2) is fake
    assert _files(state) == before                          # nothing written there
    (_, kwargs, env), = fake.calls
    assert kwargs.get("num_gpus") == 2 and "runtime_env" not in kwargs
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths == [str(C.AMDSMI_STANDIN), "/somewhere/else"]
    for p in paths + sys.path:
        assert not Path(p).resolve().is_relative_to(state.resolve()), p
    # the stand-in is the package's own file, and it hides amdsmi
    assert C.AMDSMI_STANDIN.is_relative_to(Path(C.__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", "import amdsmi"], env={**os.environ},
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1 and "ImportError: amdsmi is installed but libamd_smi.so" in out.stderr


def test_an_unsafe_stand_in_is_refused_naming_pip_uninstall_amdsmi(tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "standin"
    shutil.copytree(C.AMDSMI_STANDIN, copy)
    os.chmod(copy / "amdsmi" / "__init__.py", 0o666)
    monkeypatch.setattr(C, "AMDSMI_STANDIN", copy)
    monkeypatch.setattr(C, "_amdsmi_broken", lambda: True)
    monkeypatch.setitem(sys.modules, "ray", _FakeRay())
    monkeypatch.setenv("PYTHONPATH", "")
    with pytest.raises(CampaignError) as e:
        C.import_ray()
    assert "writable by group or others" in str(e.value)
    assert str(e.value).endswith("pip uninstall amdsmi")
    assert os.environ["PYTHONPATH"] == ""
    os.chmod(copy / "amdsmi" / "__init__.py", 0o644)
    (copy / "amdsmi" / "extra.py").symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(CampaignError, match="is a symlink"):
        C.import_ray()


def test_the_campaign_module_writes_no_python_file():
    src = Path(C.__file__).read_text()
    assert "ray-amdsmi-shim" not in src and "_AMDSMI_SHIM" not in src


# -- a disk error names its file ------------------------------------------------------------------

def test_a_disk_error_without_a_file_name_gets_one():
    import errno

    e = C._named(OSError(errno.ENOSPC, "No space left on device"), "/dev/shm (x)")
    assert e.filename == "/dev/shm (x)" and e.errno == errno.ENOSPC
    kept = OSError(errno.ENOSPC, "No space left on device", "/data/s.sqlite")
    assert C._named(kept, "/dev/shm") is kept
    other = OSError(errno.EMFILE, "Too many open files")
    assert C._named(other, "/dev/shm") is other


# -- a SIGKILLed driver leaves no process behind --------------------------------------------------

def _procs():
    """{pid: (ppid, start time, state)} of every process, from /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                raw = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()   # after "pid (comm) "
        out[int(d)] = (int(fields[1]), int(fields[19]), fields[0])
    return out


def _descendants(root, known):
    """Add to ``known`` ({pid: start time}) every live descendant of ``root`` or of a process
    already in ``known``; return the current process table."""
    table = _procs()

    def ours(pid):      # a known process, and still the same one (pids are reused)
        return pid in known and pid in table and table[pid][1] == known[pid]

    grew = True
    while grew:
        grew = False
        for pid, (ppid, start, _) in table.items():
            if pid not in known and (ppid == root or ours(ppid)):
                known[pid] = start
                grew = True
    return table


def _alive(known, table):
    """The processes of ``known`` still running (same start time, not a zombie)."""
    return sorted(pid for pid, start in known.items()
                  if pid in table and table[pid][1] == start and table[pid][2] not in "ZX")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_a_sigkilled_driver_leaves_no_worker_fork_server_or_resource_tracker(tmp_path):
    # 16 units of 5 s each on 2 simulated GPUs: 40 s of work, so the kill lands mid-campaign
    doc = {"name": "slow", "device": "sim", "seed": 0, "protocol": dict(PROTOCOL),
           "elements": ["gemm_bf16_8192", "gemm_bf16_4096", "copy_2GiB", "axpy_triton_sm16",
                        "attention_flash", "attention_cudnn", "stage_forward", "p2p_send"],
           "grid": "sm_clock_mhz=1980,1380", "simulate": {"unit_delay_s": 5}}
    (tmp_path / "slow.json").write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ECAL_STATE_DIR": str(tmp_path / "state")}
    # output to a file, not a pipe: waiting on a pipe would wait for the workers holding it
    log = open(tmp_path / "driver.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "ecal", "campaign", "slow.json", "--store",
                          "slow.sqlite", "--gpus", "2", "--quiet"], cwd=tmp_path, env=env,
                         stdout=log, stderr=subprocess.STDOUT)
    log.close()
    known: dict[int, int] = {}
    try:
        # wait for the workers: children of the fork server, itself a child of the driver
        deadline = time.monotonic() + 180
        while True:
            table = _descendants(p.pid, known)
            workers = [q for q in _alive(known, table) if table[q][0] != p.pid]
            if len(workers) >= 2:
                break
            assert p.poll() is None, (tmp_path / "driver.log").read_text()
            assert time.monotonic() < deadline, "the campaign never started its workers"
            time.sleep(0.1)
        time.sleep(1.0)                  # inside their first unit
        table = _descendants(p.pid, known)
        assert len(_alive(known, table)) >= 4, known   # resource tracker, fork server, 2 workers
        assert p.poll() is None
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=60) == -signal.SIGKILL
        deadline = time.monotonic() + 20
        while True:
            table = _descendants(-1, known)          # children a fork server still forks
            left = _alive(known, table)
            if not left:
                break
            assert time.monotonic() < deadline, (
                f"still alive 20 s after the driver's SIGKILL: "
                f"{[(q, Path(f'/proc/{q}/cmdline').read_bytes()[:80]) for q in left]}")
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        table = _procs()
        for q in _alive(known, table):       # only what this test's child started
            try:
                os.kill(q, signal.SIGKILL)
            except OSError:
                pass
