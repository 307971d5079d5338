#!/usr/bin/env bash
# Regenerates every figure and pasted output in README.md and the generated docs pages
# (docs/cli.md, demo.md, loop.md, api.md, guarantees.md, studies.md; run from the repository root):
# runs the commands into docs/out/, then renders the pages from their sources in docs/src/.
# Data: the bundled examples in ecal/examples/ and the simulated H200; nothing else.
set -euo pipefail
export MPLBACKEND=Agg
mkdir -p docs/out
ecal demo --out docs/demo                                             > docs/out/demo.txt
ecal compose ecal/examples/attention_tp2.json                          > docs/out/compose.txt
ecal check ecal/examples/h200_compositions.json                        > docs/out/check.txt || true
ecal characterize gemm_bf16_8192 -o docs/gemm.json --plot docs/gemm_characterize.png \
     > docs/out/characterize.txt 2>/dev/null
ecal frontier docs/gemm.json --plot docs/gemm_frontier.png              > docs/out/frontier.txt
ecal plan ecal/examples/pipeline_4x8.csv --deadline 1.05x --transition-time-s 0.001 \
     -o docs/plan.json --plot docs/plan.png --schedule docs/schedule.json > docs/out/plan.txt
ecal pareto ecal/examples/pipeline_4x8.csv --plot docs/pareto.png -o docs/pareto.json > docs/out/pareto.txt
ecal pareto ecal/examples/pipeline_4x8.csv --curve docs/pareto.json --plan-at 1.07x \
     -o docs/plan_at.json                                                 > docs/out/plan_at.txt
python docs/api_example.py                                              > docs/out/api.txt
python docs/api_quickstart.py                                           > docs/out/api_quickstart.txt
mkdir -p docs/route
ecal plan ecal/examples/workload_1f1b.json --deadline 1.05x -o docs/route/plan.json \
     --schedule docs/route/schedule.json                                  > docs/out/route_plan.txt
ecal run docs/route/plan.json --workload ecal/examples/workload_1f1b.json > docs/out/route_run.txt || true   # exit 1: missed or flagged
ecal tune ecal/examples/workload_1f1b.json --deadline 1.05x -o docs/route/plan_tuned.json \
     > docs/out/route_tune.txt || true   # exit 1: not converged within its rounds
python experiments/h200_composition.py --out docs/out/h200 2>&1 | sed '/^wrote /d' > docs/out/h200.txt
python docs/build_docs.py             # renders docs/src/*.md (pasting docs/out/*) into README.md and the docs pages
