"""Frontier plots: files written atomically, readable labels, units, no window (frontier.plot)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Annotation

from frontier import OperatingPoint, Signature, compose_seq, pareto_frontier
from frontier.plot import energy_unit, plot_compositions, plot_frontier, save_figure, time_unit

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sweep(name="gemm", n=12, scale=1e-3, meta=None, kappa=None):
    """An SM-clock sweep: faster at high clock, cheaper in the middle."""
    out = []
    for f in np.linspace(800, 1980, n):
        t = scale * 1980 / f
        p = 80 + 300 * (f / 1980) ** 3
        out.append(Signature.from_point(name, time_s=t, energy_j=p * t, s_w=80.0, sd_energy_j=0.01 * p * t,
                                        omega=OperatingPoint(sm_clock_mhz=float(round(f))), kappa=kappa,
                                        meta=meta or {}))
    out.append(Signature.from_point(name, time_s=3 * scale, energy_j=3 * scale * 400, s_w=80.0))  # dominated
    return out


def labels(fig):
    return [c.get_text() for ax in fig.axes for c in ax.get_children() if isinstance(c, Annotation)]


def test_plot_frontier_writes_png_atomically(tmp_path):
    out = tmp_path / "sub" / "frontier.png"
    fig = plot_frontier(sweep(), path=out)
    assert isinstance(fig, Figure)
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert sorted(os.listdir(out.parent)) == ["frontier.png"]  # no temp file left behind
    ax = fig.axes[0]
    assert "(ms)" in ax.get_xlabel() and "(J)" in ax.get_ylabel()  # 1.2 J dominated point
    assert "gemm" in ax.get_title()


def test_plot_frontier_labels_a_readable_subset():
    fig = plot_frontier(sweep(n=40), max_labels=6)
    labs = labels(fig)
    assert 2 <= len(labs) <= 6
    assert all(lab.endswith("MHz") for lab in labs)
    fig = plot_frontier(sweep(n=5, kappa="cuBLAS"), label_points=True)
    assert any(lab.startswith("cuBLAS @") for lab in labels(fig))
    fig = plot_frontier(sweep(n=5), label_points=False)
    assert labels(fig) == []


def test_plot_frontier_accepts_a_frontier_and_an_axes(tmp_path):
    fig0 = Figure()
    ax = fig0.add_subplot()
    fig = plot_frontier(pareto_frontier(sweep()), ax=ax, title="mine")
    assert fig is fig0 and ax.get_title() == "mine"


def test_units_autoscale():
    assert time_unit(5e-4) == (1e6, "µs") and time_unit(0.5) == (1e3, "ms") and time_unit(5.0) == (1.0, "s")
    assert energy_unit(5e-4)[1] == "µJ" and energy_unit(0.5)[1] == "mJ"
    assert energy_unit(5.0)[1] == "J" and energy_unit(5e3)[1] == "kJ"
    fig = plot_frontier(sweep(scale=1e-5))
    assert "(µs)" in fig.axes[0].get_xlabel() and "(mJ)" in fig.axes[0].get_ylabel()


def test_simulated_data_says_so():
    fig = plot_frontier(sweep(meta={"source": "simulated H200"}))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("SIMULATED" in t for t in texts)
    fig = plot_frontier(sweep())
    assert not any("SIMULATED" in t.get_text() for t in fig.axes[0].texts)


def test_plot_compositions(tmp_path):
    a, b = pareto_frontier(sweep("attn")), pareto_frontier(sweep("mlp", scale=2e-3))
    comp = compose_seq(a, b, max_points=10)
    out = tmp_path / "comp.png"
    fig = plot_compositions([a, b], comp, path=out)
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert len(fig.axes) == 2
    assert any("+" in lab for lab in labels(fig))  # per-element choices
    assert any("ε-thinned" in t.get_text() for t in fig.axes[1].texts)
    one = Figure().add_subplot()
    fig1 = plot_compositions([a, b], comp, ax=one)
    assert fig1.axes == [one]


def test_failed_save_leaves_old_file(tmp_path):
    out = tmp_path / "f.png"
    out.write_bytes(b"old")
    fig = plot_frontier(sweep())
    with pytest.raises(ValueError):
        save_figure(fig, tmp_path / "f.notaformat")
    assert out.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["f.png"]


def test_no_pyplot_and_backend_untouched():
    code = ("import sys, matplotlib; before = matplotlib.get_backend(); import frontier.plot as p; "
            "import frontier; from frontier import Signature; "
            "p.plot_frontier([Signature('k', s_w=1, time_s=1, d_j=1)]); "
            "print('matplotlib.pyplot' in sys.modules, matplotlib.get_backend() == before)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "MPLBACKEND": "Agg"})
    assert res.stdout.split() == ["False", "True"]


def test_signature_file_to_frontier_table_and_plot(tmp_path):
    """The `ecal frontier FILE --plot OUT.png` path: file → pareto_frontier → table and plot."""
    from frontier.io import load_signatures, save_signatures

    pts = sweep(n=6)
    path = tmp_path / "gemm.json"
    save_signatures(path, {f"gemm@{i}": p for i, p in enumerate(pts)})
    loaded = list(load_signatures(path).values())
    assert [p.key for p in loaded] != [] and all(q.var_energy_j2 == p.var_energy_j2 for p, q in zip(pts, loaded))
    f = pareto_frontier(loaded, name="gemm")
    table = f.to_table()
    assert "T (ms)" in table and "E (J)" in table and "±" in table and "MHz" in table
    out = tmp_path / "gemm.png"
    plot_frontier(loaded, path=out, title="gemm")
    assert out.read_bytes()[:8] == PNG_MAGIC
