#!/usr/bin/env bash
# The CUDA workers' staged-KV path on the CPU: tests/e2e/test_gpu_workers.sh with GPUW_CPU=1
# (prefill and decode keep the model's KV pool apart from the UCX pool and copy blocks between
# them with model_kv_download / model_kv_upload; greedy output == tandem generate).
GPUW_CPU=1 exec bash "$(dirname "$0")/test_gpu_workers.sh"
