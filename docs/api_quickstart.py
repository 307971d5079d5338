"""The Python API in a dozen lines (pasted with its output in README.md; docs/api.md has more)."""

from frontier import Signature, seq
from solvers import ConstantTransition, one_f_one_b, solve

# Signatures from repeated runs (per-invocation T and E); s = ready power. ⊗ = seq.
gemm = Signature.from_runs("gemm", [1.62e-3, 1.60e-3, 1.61e-3], [1.14, 1.12, 1.13], s_w=123.0)
copy = Signature.from_runs("copy", [1.01e-3, 1.00e-3, 1.01e-3], [0.62, 0.60, 0.61], s_w=123.0)
step = seq([seq(gemm, copy)] * 100)
print(f"100 x (gemm ⊗ copy): T = {step.time_s*1e3:.1f} ± {step.sd_time_s*1e3:.2f} ms, "
      f"E = {step.energy_j:.1f} ± {step.sd_energy_j:.2f} J")

# Plan a 2-stage x 4-microbatch 1F1B step: each task at 1980 or 1410 MHz, 2 ms per switch.
opts = {(s, i): [{"time_s": t * (1 + 0.2 * s), "energy_j": e * (1 + 0.2 * s), "s_w": 75.0,
                  "omega": {"sm_clock_mhz": f}} for t, e, f in ((0.030, 9.0, 1980), (0.036, 7.6, 1410))]
        for s in range(2) for i in ("forward", "backward")}
problem = one_f_one_b(2, 4, opts, idle_power_w=75.0, transitions=ConstantTransition(0.002, 0.0))
plan = solve(problem, "1.10x")
print(f"plan: {plan.energy_j:.2f} J in {plan.makespan_s*1e3:.1f} ms (deadline {plan.deadline_s*1e3:.1f} ms), "
      f"{plan.n_switches} switches, method {plan.method}, gap {plan.gap:.2%}")
