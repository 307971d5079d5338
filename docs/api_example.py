"""The Python API in one page (its output is pasted in README.md)."""

from frontier import Signature, deviation, par, seq
from solvers import ConstantTransition, one_f_one_b, solve

# 1. Signatures from repeated runs (per-invocation T and E per window); s = ready power.
gemm = Signature.from_runs("gemm", [1.62e-3, 1.60e-3, 1.61e-3], [1.14, 1.12, 1.13], s_w=123.0)
copy = Signature.from_runs("copy", [1.01e-3, 1.00e-3, 1.01e-3], [0.62, 0.60, 0.61], s_w=123.0)

# 2. Compose: 100 x (gemm then copy) back to back, and gemm overlapped with copy on one GPU.
step = seq([seq(gemm, copy)] * 100, name="100 x (gemm ⊗ copy)")
both = par(gemm, copy)
print(f"100 x (gemm ⊗ copy): T = {step.time_s*1e3:.1f} ± {step.sd_time_s*1e3:.2f} ms, "
      f"E = {step.energy_j:.1f} ± {step.sd_energy_j:.2f} J, bias bound {step.bias_bound_j():.1f} J")
print(f"gemm ⊕ copy: E = {both.energy_j:.3f} J (saves s·min(T) = {gemm.energy_j + copy.energy_j - both.energy_j:.3f} J)")

# 3. Check a measurement of the composite against the prediction (Eq. 23).
measured = Signature.from_point("measured", time_s=0.2580, energy_j=176.9, s_w=123.0,
                                sd_time_s=0.0004, sd_energy_j=0.9)
print(deviation(step, measured).summary())

# 4. Plan a 2-stage x 4-microbatch 1F1B step whose tasks can run at two clocks.
opts = {(s, i): [{"time_s": t * (1 + 0.2 * s), "energy_j": e * (1 + 0.2 * s), "s_w": 75.0,
                  "omega": {"sm_clock_mhz": f}}
                 for t, e, f in ((0.030, 9.0, 1980), (0.036, 7.6, 1410))]
        for s in range(2) for i in ("forward", "backward")}
problem = one_f_one_b(2, 4, opts, idle_power_w=75.0, transitions=ConstantTransition(0.002, 0.0))
plan = solve(problem, "1.10x")
print(f"plan: {plan.energy_j:.2f} J in {plan.makespan_s*1e3:.1f} ms "
      f"(deadline {plan.deadline_s*1e3:.1f} ms), {plan.n_switches} switches, method {plan.method}, gap {plan.gap:.2%}")
