#!/usr/bin/env bash
# kernels/cuda/k45_i8.cuh's unit on the CPU (tests/unit/k45_i8_sim.cc says how): the header's device
# part, without its #include and its mma.sync (the simulation has its own), and gemv_mma.cuh's
# gm_k45_w / gm_k45_load are cut out by their markers (sim_lib.sh's sim_cut_k45) and built with g++
# -std=c++20 (std::barrier).
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/k45_i8
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
sim_cut_k45 "$dir/k45_i8_body.inc"
sim_build k45_i8_sim tests/unit/k45_i8_sim.cc -Wno-unknown-pragmas
exec "$dir/k45_i8_sim" "$@"
