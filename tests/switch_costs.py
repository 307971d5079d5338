"""Switch-cost rules shared by the solver tests."""

from dataclasses import dataclass


@dataclass(frozen=True)
class PairCost:
    """(τ, ε) growing with the clock step — switch costs that depend on the pair (the MILP
    then needs the transport matrix): τ = tau0_s + tau_s_per_ghz·|Δf|, ε likewise."""

    tau0_s: float = 0.02
    tau_s_per_ghz: float = 0.3
    energy0_j: float = 0.5
    energy_j_per_ghz: float = 8.0

    def cost(self, frm, to):
        """(latency s, extra energy J) of switching ``frm`` → ``to``."""
        if frm is None or frm == to:
            return (0.0, 0.0)
        df = abs(frm.sm_clock_mhz - to.sm_clock_mhz) / 1000.0
        return (self.tau0_s + self.tau_s_per_ghz * df, self.energy0_j + self.energy_j_per_ghz * df)
