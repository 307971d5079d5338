"""A synthetic ``torch.profiler`` trace of one data-parallel transformer training step.

What a GPT-style step looks like at kernel granularity on an H200-class GPU, per rank: for each
of ``layers`` layers a forward pass (layer norm, QKV GEMM, flash attention, output projection,
residual add, layer norm, MLP up GEMM, GELU, MLP down GEMM, residual add), then the backward
pass in reverse (data- and weight-gradient GEMMs, flash attention backward, the elementwise and
norm kernels' backward), then the gradient all-reduce in buckets (NCCL ring kernels, one per
bucket) and the Adam update (``multi_tensor_apply`` chunks). Kernel times are those of a
4096-wide layer at sequence 2048 (bf16), each with a small seeded jitter, and launch gaps of a
few microseconds between kernels, with a longer host stall before the all-reduce. One file per
rank, as a distributed job writes them; ``ecal import torch-trace rank*.json`` reads them.

    python experiments/transformer_trace.py OUT_DIR [--ranks 2] [--layers 24] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

T0_US = 1_733_400_000_000.0
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1"
FLASH_FWD = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)"
FLASH_BWD = "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128> >(Flash_bwd_params)"
LN = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
LN_BWD = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<c10::BFloat16, float>"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"
GELU_BWD = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl>"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ADAM = "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4> >"

#: (name, grid, duration us) of one layer's forward and backward kernels (4096 wide, seq 2048)
FORWARD = [(LN, [2048, 1, 1], 24), (GEMM, [96, 16, 1], 310), (FLASH_FWD, [16, 32, 1], 260),
           (GEMM, [32, 16, 1], 105), (ADD, [4096, 1, 1], 14), (LN, [2048, 1, 1], 24),
           (GEMM, [128, 16, 1], 410), (GELU, [8192, 1, 1], 42), (GEMM, [32, 64, 1], 410),
           (ADD, [4096, 1, 1], 14)]
BACKWARD = [(GEMM, [32, 16, 1], 410), (GEMM, [32, 128, 1], 415), (GELU_BWD, [8192, 1, 1], 63),
            (GEMM, [128, 16, 1], 410), (GEMM, [128, 32, 1], 415), (LN_BWD, [2048, 1, 1], 48),
            (ADD, [4096, 1, 1], 14), (GEMM, [32, 16, 1], 105), (GEMM, [32, 32, 1], 108),
            (FLASH_BWD, [16, 32, 1], 620), (GEMM, [96, 16, 1], 310), (GEMM, [96, 32, 1], 315),
            (LN_BWD, [2048, 1, 1], 48)]


def rank_events(rank: int, layers: int, buckets: int, adam_chunks: int, seed: int) -> list[dict]:
    """One rank's Chrome-trace events (device ``rank``, compute stream 7, NCCL stream 20)."""
    rng = random.Random(seed * 1000 + rank)
    t = 0.0
    events: list[dict] = []

    def kernel(name: str, grid: list[int], dur_us: float, stream: int = 7, gap_us: float | None = None) -> None:
        nonlocal t
        t += rng.uniform(1.0, 4.0) if gap_us is None else gap_us
        d = dur_us * rng.uniform(0.98, 1.02)
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": rank, "tid": stream,
                       "ts": T0_US + t, "dur": round(d, 3),
                       "args": {"device": rank, "stream": stream, "grid": grid,
                                "block": [256, 1, 1]}})
        t += d

    for _ in range(layers):
        for name, grid, dur in FORWARD:
            kernel(name, grid, dur)
    for _ in range(layers):
        for name, grid, dur in BACKWARD:
            kernel(name, grid, dur)
    # the host waits on the backward's last kernel before it launches the bucketed all-reduce
    for b in range(buckets):
        kernel(ALLREDUCE, [32, 1, 1], 2100, stream=20, gap_us=40.0 if b == 0 else None)
    for _ in range(adam_chunks):
        kernel(ADAM, [320, 1, 1], 160)
    return events


def write_traces(out: Path, ranks: int = 2, layers: int = 24, buckets: int = 4,
                 adam_chunks: int = 30, seed: int = 0) -> list[Path]:
    """Write ``rank{r}.json`` for every rank into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        p = out / f"rank{r}.json"
        p.write_text(json.dumps({"schemaVersion": 1, "traceEvents":
                                 rank_events(r, layers, buckets, adam_chunks, seed)}))
        paths.append(p)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for p in write_traces(a.out, a.ranks, a.layers, seed=a.seed):
        print(p)


if __name__ == "__main__":
    main()
