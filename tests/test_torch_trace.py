"""``ecal import torch-trace``: a torch.profiler Chrome trace → a workload (measure.torch_trace).

The synthetic trace below (times in us from T0) has two devices; device 0 runs two streams:

    gpu0 stream 7   gemm [0,100]   elementwise [105,108]   elementwise [110,113]   gemm [300,400]
    gpu0 stream 13  memcpy [120,170]   nccl allreduce [180,240]
    gpu1 stream 7   gemm [0,80]    flash attention [90,130]

Every expectation is worked out by hand from it (module docstring of measure.torch_trace).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import ecal
from ecal.cli import main
from frontier.errors import FormatError, InputError
from frontier.formats import content, validate
from measure.sim import SimulatedGPU, preset, traced_kernel, traced_work_name
from measure.torch_trace import (
    TraceError,
    classify,
    group_trace,
    parse_torch_trace,
    read_torch_trace,
)

T0 = 1_733_400_000_000.0     # torch writes microseconds since the epoch
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"
ELTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl"
           "(at::TensorIteratorBase&)::{lambda(float)#1}, at::detail::Array<char*, 2> >"
           "(int, at::native::GeluCUDAKernelImpl, at::detail::Array<char*, 2>)")
MEMCPY = "Memcpy HtoD (Pageable -> Device)"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
FLASH = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)"


def _k(name, dev, stream, ts, dur, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": dev, "tid": stream, "ts": T0 + ts,
            "dur": dur, "args": {"device": dev, "stream": stream, "correlation": 1, **args}}


def synthetic_events():
    g = {"grid": [8, 8, 1], "block": [256, 1, 1]}
    e = {"grid": [512, 1, 1], "block": [128, 1, 1]}
    return [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": T0 - 5,
         "dur": 4, "args": {"Input Dims": [[64, 64], [64, 64]]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,
         "ts": T0 - 3, "dur": 2},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 4242, "tid": 4242, "ts": T0 - 3},
        _k(GEMM, 0, 7, 0, 100, **g),
        _k(ELTWISE, 0, 7, 105, 3, **e),
        _k(ELTWISE, 0, 7, 110, 3, **e),
        _k(MEMCPY, 0, 13, 120, 50, cat="gpu_memcpy", bytes=4096),
        _k(NCCL, 0, 13, 180, 60, grid=[2, 1, 1], block=[512, 1, 1]),
        _k(GEMM, 0, 7, 300, 100, **g),
        _k(GEMM, 1, 7, 0, 80, **g),
        _k(FLASH, 1, 7, 90, 40, grid=[32, 16, 1], block=[128, 1, 1]),
    ]


@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": synthetic_events()}))
    return p


# -- reading ---------------------------------------------------------------------------------

def test_reads_kernels_and_memcpy_and_skips_the_rest(trace_file):
    t = read_torch_trace(trace_file)
    assert len(t.kernels) == 8 and not t.cpu_ops
    assert [k.name for k in t.kernels][:2] == [GEMM, ELTWISE]
    m = next(k for k in t.kernels if k.category == "gpu_memcpy")
    assert (m.device, m.stream) == ("0", "13")
    assert m.start_s == pytest.approx(120e-6, abs=1e-12) and m.duration_s == pytest.approx(50e-6)
    assert dict(m.identity) == {"bytes": "4096"}
    g = t.kernels[0]
    assert dict(g.identity) == {"grid": "[8,8,1]", "block": "[256,1,1]"}
    # a bare list of events is a trace too
    assert len(parse_torch_trace(synthetic_events(), "x.json").kernels) == 8


@pytest.mark.parametrize("content,needle", [
    ("this is not json", "invalid JSON"),
    ("", "invalid JSON"),
    ('{"traceEvents": []}', "no events"),
    ("[]", "no events"),
    ('{"schemaVersion": 1}', "no traceEvents"),
    ('"a string"', "must be a Chrome trace"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": NaN, '
     '"args": {"device": 0, "stream": 7}}]}', "traceEvents[0].dur"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": -2, '
     '"args": {"device": 0, "stream": 7}}]}', "traceEvents[0].dur: must be >= 0"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 2, '
     '"args": {"device": 0, "stream": 7}}]}', "traceEvents[0].ts: missing"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 2, '
     '"args": {"device": 0, "stream": 7}}]}', "traceEvents[0].name: missing"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "1", "dur": 2, '
     '"args": {"device": 0, "stream": 7}}]}', "traceEvents[0].ts: must be a number"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]}',
     "no device"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, '
     '"ts": 1, "dur": 2}]}', "no GPU kernels"),
    ('{"traceEvents": [3]}', "traceEvents[0]: must be an event"),
])
def test_malformed_traces_are_one_line_naming_the_file(tmp_path, capsys, content, needle):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(FormatError) as e:
        read_torch_trace(p)
    assert needle in str(e.value) and str(p) in str(e.value)
    out = tmp_path / "w.json"
    assert main(["import", "torch-trace", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "bad.json" in err[0]
    assert not out.exists()


def test_a_cpu_trace_says_cpu_ops_reads_it(tmp_path):
    p = tmp_path / "cpu.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                              "tid": 1, "ts": 1, "dur": 2}]))
    with pytest.raises(TraceError, match="--cpu-ops"):
        read_torch_trace(p)
    t = read_torch_trace(p, cpu_ops=True)
    assert [k.name for k in t.kernels] == ["aten::mm"]


def test_cpu_ops_keep_the_outermost_op_of_each_thread():
    ev = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": tid, "ts": ts, "dur": d,
           "args": {"Input Dims": [[4, 4], [4, 4]]}}
          for n, tid, ts, d in [("aten::matmul", 1, 0, 10), ("aten::mm", 1, 1, 8),
                                ("aten::relu", 1, 12, 2), ("aten::add", 2, 3, 1)]]
    t = parse_torch_trace(ev, cpu_ops=True)
    assert [k.name for k in t.kernels] == ["aten::matmul", "aten::relu", "aten::add"]
    w = group_trace(t, streams="lanes")
    assert w.lanes == ("gpu0.s1", "gpu0.s2")
    assert {e.name: e.roofline for e in w.elements} == {
        "gpu0/matmul": "compute", "gpu0/relu": "memory", "gpu0/add": "memory"}


def _stepped_events():
    """Two profiler steps (CPU [0,50] and [50,100]); kernel B is launched in step 1 and runs in
    step 2's CPU time; D has no launch on record and starts in step 2."""
    ann = [{"ph": "X", "cat": c, "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": T0 + ts,
            "dur": 50} for c, k, ts in [("user_annotation", 1, 0), ("user_annotation", 2, 50),
                                        ("gpu_user_annotation", 1, 50)]]
    launch = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
               "ts": T0 + ts, "dur": 1, "args": {"correlation": c}} for c, ts in [(1, 10), (2, 40), (3, 60)]]
    ks = [_k(n, 0, 7, ts, d, correlation=c) for n, ts, d, c in [("A", 20, 10, 1), ("B", 55, 10, 2),
                                                                  ("C", 70, 5, 3)]]
    d = _k("D", 0, 7, 80, 2)
    del d["args"]["correlation"]
    return ann + launch + ks + [d]


def test_one_profiler_step_is_read_by_its_launches(tmp_path, capsys):
    ev = _stepped_events()
    assert [k.name for k in parse_torch_trace(ev, step=1).kernels] == ["A", "B"]
    t2 = parse_torch_trace(ev, step=2)
    assert [k.name for k in t2.kernels] == ["C", "D"] and t2.steps == (1, 2) and t2.step == 2
    assert t2.kernels[0].start_s == 0.0
    with pytest.raises(TraceError, match=r"no ProfilerStep#3 \(the trace's profiler steps: #1, #2"):
        parse_torch_trace(ev, step=3)
    p = tmp_path / "stepped.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    out = tmp_path / "w.json"
    assert main(["import", "torch-trace", str(p), "-o", str(out)]) == 0
    assert "marks 2 profiler steps (#1..#2; --step K reads one)" in capsys.readouterr().out
    assert main(["import", "torch-trace", str(p), "--step", "1", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ProfilerStep#1" in text and "kernels     2 " in text and "profiler steps" not in text


# -- classification ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,cat,cls", [
    (GEMM, "kernel", "compute"), (FLASH, "kernel", "compute"), ("aten::mm", "cpu_op", "compute"),
    ("aten::addmm", "cpu_op", "compute"), ("cudnn::implicit_convolve_sgemm", "kernel", "compute"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "kernel", "compute"),
    (ELTWISE, "kernel", "memory"), (MEMCPY, "gpu_memcpy", "memory"),
    ("Memset (Device)", "gpu_memset", "memory"), ("softmax_warp_forward", "kernel", "memory"),
    ("vectorized_layer_norm_kernel", "kernel", "memory"), ("reduce_kernel", "kernel", "memory"),
    ("convert_fp32_to_bf16", "kernel", "memory"), ("aten::mmx_unknown", "cpu_op", "memory"),
    (NCCL, "kernel", "memory"), ("something_else", "kernel", "memory"),
    ("sm90_xmma_warpspecialized_bf16", "kernel", "compute"), ("volta_h884gemm", "kernel", "compute"),
    ("turing_fp16_s1688hmma_128x128", "kernel", "compute"),
    ("multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4> >", "kernel", "memory"),
])
def test_classification_rule(name, cat, cls):
    assert classify(name, cat) == cls


def test_the_class_map_comes_first_longest_part_winning():
    over = {"nccl": "compute", "ncclKernel_AllReduce": "memory", "gemm": "memory"}
    assert classify(NCCL, "kernel", over) == "memory"
    assert classify("ncclKernel_Broadcast", "kernel", over) == "compute"
    assert classify(GEMM, "kernel", over) == "memory"


# -- grouping and edges --------------------------------------------------------------------------

def test_lanes_elements_tasks_edges_by_hand(trace_file):
    w = group_trace(read_torch_trace(trace_file), streams="lanes", min_gap_s=None)
    assert w.gpus == ("gpu0", "gpu1") and w.lanes == ("gpu0.s7", "gpu0.s13", "gpu1")
    assert w.kernels == 8 and w.memory_ops == 1 and w.streams == 3
    assert w.kernel_time_s == pytest.approx(436e-6) and w.span_s == pytest.approx(400e-6)
    els = {e.name: (e.roofline, round(e.duration_s * 1e6, 6), e.tasks, e.work) for e in w.elements}
    assert els == {
        f"gpu0/{GEMM}"[:53]: ("compute", 100.0, 2, "traced_compute_100us"),
        "gpu0/vectorized_elementwise_kernel": ("memory", 3.0, 2, "traced_memory_3us"),
        "gpu0/Memcpy_HtoD": ("memory", 50.0, 1, "traced_memory_50us"),
        "gpu0/ncclKernel_AllReduce_RING_LL_Sum_float": ("memory", 60.0, 1, "traced_memory_60us"),
        f"gpu1/{GEMM}"[:53]: ("compute", 80.0, 1, "traced_compute_80us"),
        "gpu1/flash_fwd_kernel": ("compute", 40.0, 1, "traced_compute_40us"),
    }
    assert [(t.name, t.element.split("/")[1][:6]) for t in w.tasks] == [
        ("gpu0.s7/0", "ampere"), ("gpu0.s7/1", "vector"), ("gpu0.s7/2", "vector"),
        ("gpu0.s7/3", "ampere"), ("gpu0.s13/0", "Memcpy"), ("gpu0.s13/1", "ncclKe"),
        ("gpu1/0", "ampere"), ("gpu1/1", "flash_")]
    # s7's gemm at 300 starts after s13's allreduce ended (240): that edge, not the memcpy's
    # (implied); s13's memcpy at 120 starts after s7's second elementwise (113); the
    # allreduce's edge from it is implied by the memcpy's; none across devices
    assert w.edges == (("gpu0.s13/1", "gpu0.s7/3"), ("gpu0.s7/2", "gpu0.s13/0"))


def test_min_duration_merges_runs_of_short_kernels(trace_file):
    w = group_trace(read_torch_trace(trace_file), min_duration_s=10e-6, streams="lanes",
                    min_gap_s=None)
    run = next(e for e in w.elements if "+" in e.name)
    assert run.name == "gpu0/vectorized_elementwise_kernel+1" and len(run.kernels) == 2
    assert run.duration_s == pytest.approx(6e-6) and run.roofline == "memory"
    assert run.work == "traced_memory_6us"
    assert [t.name for t in w.tasks if t.device == "gpu0.s7"] == ["gpu0.s7/0", "gpu0.s7/1", "gpu0.s7/2"]
    merged = w.tasks[1]
    assert (merged.kernels, merged.busy_s) == (2, pytest.approx(6e-6))
    assert (merged.end_s - merged.start_s) == pytest.approx(8e-6)
    assert len(w.elements) == 6 and len(w.tasks) == 7
    assert w.edges == (("gpu0.s13/1", "gpu0.s7/2"), ("gpu0.s7/1", "gpu0.s13/0"))


def test_a_run_takes_the_class_of_most_of_its_time():
    ev = [_k("tiny_gemm", 0, 7, 0, 4), _k("relu_kernel", 0, 7, 5, 1), _k("big_gemm", 0, 7, 10, 50)]
    w = group_trace(parse_torch_trace(ev), min_duration_s=5e-6, streams="lanes")
    assert [(e.name, e.roofline) for e in w.elements] == [("gpu0/tiny_gemm+1", "compute"),
                                                          ("gpu0/big_gemm", "compute")]


def test_serial_lays_a_device_out_in_start_order(trace_file):
    w = group_trace(read_torch_trace(trace_file), streams="serial", device_prefix="rank",
                    min_gap_s=None)
    assert w.lanes == ("rank0", "rank1") and w.edges == ()
    assert [t.element.split("/")[1][:6] for t in w.tasks if t.device == "rank0"] == [
        "ampere", "vector", "vector", "Memcpy", "ncclKe", "ampere"]


def test_same_short_name_different_identity_are_two_elements():
    ev = [_k("void k<1>(int)", 0, 7, 0, 5, grid=[1, 1, 1]), _k("void k<2>(int)", 0, 7, 10, 5, grid=[2, 1, 1]),
          _k("void k<1>(int)", 0, 7, 20, 7, grid=[1, 1, 1])]
    w = group_trace(parse_torch_trace(ev), streams="lanes", min_gap_s=None)
    assert [(e.name, e.tasks, round(e.duration_s * 1e6, 6)) for e in w.elements] == [
        ("gpu0/k", 2, 6.0), ("gpu0/k.2", 1, 5.0)]


def test_edges_are_acyclic_even_with_zero_durations():
    ev = [_k("a", 0, 1, 0, 0), _k("b", 0, 2, 0, 0), _k("c", 0, 1, 0, 0), _k("d", 0, 2, 0, 0)]
    w = group_trace(parse_torch_trace(ev), streams="lanes")
    pos = {t.name: i for i, t in enumerate(sorted(w.tasks, key=lambda t: (t.start_s, t.end_s, t.device)))}
    assert all(pos[a] < pos[b] or a.split("/")[0] == b.split("/")[0] for a, b in w.edges)
    import graphlib
    g = graphlib.TopologicalSorter()
    for a, b in w.edges:
        g.add(b, a)
    for lane in w.lanes:
        names = [t.name for t in w.tasks if t.device == lane]
        for x, y in zip(names, names[1:]):
            g.add(y, x)
    list(g.static_order())      # raises CycleError on a cycle


def test_bad_grouping_options_are_input_errors(trace_file):
    t = read_torch_trace(trace_file)
    for kw in ({"streams": "both"}, {"min_duration_s": -1.0}, {"min_duration_s": math.nan},
               {"device_prefix": "g@"}):
        with pytest.raises(InputError):
            group_trace(t, **kw)


# -- the simulated work ------------------------------------------------------------------------

@pytest.mark.parametrize("kind,us", [("compute", 100.0), ("memory", 3.0), ("compute", 0.5)])
def test_traced_kernels_take_their_time_at_the_default_point(kind, us):
    name = traced_work_name(kind, us * 1e-6)
    k = preset(name)
    assert k == traced_kernel(name) and k.name == name
    gpu = SimulatedGPU()
    st = gpu.kernel_state(k, temperature_c=gpu.spec.ambient_c + gpu.spec.thermal_r_c_per_w * 700)
    assert st.time_s == pytest.approx(us * 1e-6, rel=0.02)
    # compute slows with the clock, memory hardly
    from frontier.operating_point import OperatingPoint
    low = gpu.kernel_state(k, OperatingPoint(sm_clock_mhz=990.0))
    assert (low.time_s / st.time_s > 1.3) == (kind == "compute")


def test_traced_work_names():
    assert traced_work_name("compute", 12.5e-6) == "traced_compute_12.5us"
    assert traced_work_name("memory", 0.0) == "traced_memory_0.001us"
    assert traced_kernel("traced_gemm_3us") is None and traced_kernel("stage_forward") is None
    with pytest.raises(InputError):
        traced_work_name("io", 1e-6)


# -- the command line, end to end --------------------------------------------------------------

def test_import_writes_a_workload_that_validates_and_plans(trace_file, tmp_path, capsys):
    from execution.workload import load_workload
    from execution.workload_models import WorkloadFile

    out = tmp_path / "step.json"
    assert main(["import", "torch-trace", str(trace_file), "-o", str(out), "--streams", "lanes"]) == 0
    text = capsys.readouterr().out
    assert "kernels     8 (1 memory copies/fills) on 2 device(s), 3 stream(s)" in text
    # + launch gaps (test_launch_gaps_by_hand): 5, 7, 10, 60 us on gpu0 and 10 us on gpu1
    assert "elements    11" in text and "tasks       13 on 3 lane(s)" in text
    assert "5 launch gaps" in text and "edges       2 across streams" in text
    assert "kernel time 0.436 ms" in text and "launch gaps 0.092 ms kept, 0.002 ms" in text
    doc = json.loads(out.read_text())
    validate(WorkloadFile, content(str(out), doc, "workload")[1], str(out))
    assert doc["shape"]["kind"] == "dag" and len(doc["shape"]["tasks"]) == 13
    assert doc["elements"]["gpu0/gap_60us"]["work"] == "traced_gap_60us"
    assert doc["transitions"] == {"constant": {"time_s": 0.002, "energy_j": 0.0}}
    assert {e["source"] for e in doc["elements"].values()} == {"step.sigs.json"}
    assert doc["elements"]["gpu1/flash_fwd_kernel"]["work"] == "traced_compute_40us"
    char = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("ecal characterize"))
    plan = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("ecal plan"))

    # run the printed characterize command (a small grid: this is a test), from tmp_path
    import shlex
    argv = shlex.split(char)[1:]
    assert argv[argv.index("-o") + 1].endswith("step.sigs.json")
    assert main([*argv, "--grid", "sm_clock_mhz=1980,1380"]) == 0
    capsys.readouterr()
    wl = load_workload(out)
    assert len(wl.problem.tasks) == 13 and wl.simulated
    assert main([*shlex.split(plan)[1:3], "--deadline", "1.2x", "-o", str(tmp_path / "plan.json"),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["makespan_s"] > 0 if "makespan_s" in res else True
    assert (tmp_path / "plan.json").exists()


def test_import_options_and_refusals(trace_file, tmp_path, capsys):
    out = tmp_path / "w.json"
    tr = tmp_path / "tr.json"
    tr.write_text((Path(ecal.__file__).parent / "examples" / "transitions_sim_h200.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    classes = tmp_path / "classes.json"
    classes.write_text(json.dumps({"nccl": "compute"}))
    assert main(["import", "torch-trace", str(trace_file), "-o", str(out), "--min-duration-us", "10",
                 "--streams", "serial", "--device-prefix", "rank", "--idle-power-w", "90",
                 "--classes", str(classes), "--transitions", str(tr), "--signatures", "s/x.json",
                 "--name", "mine", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    # 7 tasks (the two elementwise kernels one run) and 5 launch gaps (5, 7, 10, 60; 10 us)
    assert res["lanes"] == ["rank0", "rank1"] and res["tasks"] == 12 and res["edges"] == 0
    assert res["gap_tasks"] == 5 and res["gap_time_s"] == pytest.approx(92e-6)
    assert res["elements"]["rank0/ncclKernel_AllReduce_RING_LL_Sum_float"]["roofline"] == "compute"
    doc = json.loads(out.read_text())
    assert doc["name"] == "mine" and doc["idle_power_w"] == 90.0
    assert doc["transitions"] == {"file": "tr.json"}
    assert {e["source"] for e in doc["elements"].values()} == {"s/x.json"}

    before = trace_file.read_bytes()
    for argv, needle in [
        (["-o", str(trace_file)], "is the input file"),
        (["-o", str(out), "--min-duration-us", "-1"], "--min-duration-us -1"),
        (["-o", str(out), "--idle-power-w", "nan"], "idle-power-w"),
        (["-o", str(out), "--classes", str(bad)], "non-empty object"),
        (["-o", str(out), "--transitions", str(bad)], "bad.json"),
        (["-o", str(out), "--transitions", str(tmp_path / "none.json")], "none.json"),
        (["-o", str(out), "--signatures", str(trace_file)], "--signatures"),
    ]:
        out.unlink(missing_ok=True)
        assert main(["import", "torch-trace", str(trace_file), *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)
        assert not out.exists()
    assert trace_file.read_bytes() == before


def test_torch_trace_has_its_own_help(capsys):
    from ecal import cmd_import
    from measure import torch_trace
    assert cmd_import.STREAM_MODES == torch_trace.STREAM_MODES

    with pytest.raises(SystemExit) as e:
        main(["import", "torch-trace", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ecal import torch-trace") and "--min-duration-us" in out
    assert "--cpu-ops" in out and "workload" in out


# -- a real torch.profiler trace -----------------------------------------------------------------

def test_a_real_cpu_profiler_trace(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(5):
            c = torch.matmul(a, b)
            c = torch.relu(c)
    p = tmp_path / "cpu_trace.json"
    prof.export_chrome_trace(str(p))
    t = read_torch_trace(p, cpu_ops=True)
    names = [k.name for k in t.kernels]
    assert names.count("aten::matmul") == 5 and "aten::mm" not in names
    w = group_trace(t, streams="lanes")
    mm = next(e for e in w.elements if e.name.endswith("/matmul"))
    assert mm.roofline == "compute" and mm.tasks == 5
    out = tmp_path / "w.json"
    assert main(["import", "torch-trace", str(p), "--cpu-ops", "-o", str(out)]) == 0
    from execution.workload_models import WorkloadFile
    validate(WorkloadFile, content(str(out), json.loads(out.read_text()), "workload")[1], str(out))


def test_by_default_a_gpu_is_one_lane_so_its_plan_has_one_clock(trace_file):
    # a plan that clocks two streams of one GPU differently could not be applied
    w = group_trace(read_torch_trace(trace_file))
    assert w.lanes == ("gpu0", "gpu1") and w.edges == ()
