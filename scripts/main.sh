#!/usr/bin/env bash
# Set up, build, and run the main job on this machine: agbench over simulated nodes
# (4 ranks on 2 nodes, AllGather and ReduceScatter, hierarchical vs ring), then a short
# sharded training run of the GPT example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

# Hierarchical and the flat ring side by side in one run (the ring columns come last).
echo "== main: agbench allgather, 4 ranks on 2 simulated nodes"
build/perf/agbench allgather --np 4 --nodes 2 -b 1M -e 64M -f 4 -n 10 -w 3 -c 1 --baseline ring -v
echo "== main: agbench reducescatter, 4 ranks on 2 simulated nodes"
build/perf/agbench reducescatter --np 4 --nodes 2 -b 1M -e 64M -f 4 -n 10 -w 3 -c 1 --baseline ring

echo "== main: sharded training (train_gpt, 4 ranks on 2 nodes, sdp degree 2)"
build/examples/train_gpt/train_gpt --np 4 --nodes 2 --sdp-degree 2 --steps 30 --seed 7 --precision fp32
