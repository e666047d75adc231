#!/usr/bin/env bash
# Installs the Debian 12 packages tandem builds and tests with. Run as root (or with sudo).
# The CUDA toolkit is optional and not installed here: with nvcc on the PATH (or in
# /usr/local/cuda/bin) `make` also builds the CUDA backend.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
	build-essential pkg-config ca-certificates clang-format \
	libuv1-dev libprotobuf-c-dev protobuf-c-compiler libjansson-dev libpcre2-dev libutf8proc-dev \
	libucx-dev ucx-utils node-llhttp libsystemd-dev systemd curl \
	nodejs npm wrk prometheus \
	>/dev/null
echo "tandem: build dependencies installed"
