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
	wrk prometheus \
	>/dev/null
# The e2e tests drive the router with the official OpenAI npm client on Node 20. Machines that
# already have Node (e.g. from NodeSource, whose nodejs bundles npm and conflicts with Debian's npm
# package) keep theirs.
if ! command -v node >/dev/null 2>&1; then
	apt-get install -y -qq --no-install-recommends nodejs >/dev/null
fi
if ! command -v npm >/dev/null 2>&1; then
	apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
echo "tandem: build dependencies installed"
