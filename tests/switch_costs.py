"""Switch-cost rules shared by the solver tests."""


class PairCost:
    """(τ, ε) growing with the clock step: switch costs that depend on the pair."""

    def cost(self, frm, to):
        """(latency s, extra energy J) of switching ``frm`` → ``to``."""
        if frm is None or frm == to:
            return (0.0, 0.0)
        df = abs(frm.sm_clock_mhz - to.sm_clock_mhz) / 1000.0
        return (0.02 + 0.3 * df, 0.5 + 8.0 * df)
