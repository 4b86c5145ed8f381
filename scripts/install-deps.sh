#!/usr/bin/env bash
# install-deps.sh - installs the Debian packages fleet needs to build and test (the libraries,
# the real data set Fashion-MNIST, gnuplot for fleet-plot, NumPy for the tests that read fleet's
# files from Python); with --bench also what its benchmarks compare against (PyTorch 1.13).
# Idempotent and quiet when everything is already there.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libopenblas-openmp-dev libyaml-dev libjpeg62-turbo-dev
      libopenmpi-dev openmpi-bin iproute2 clang libclang-rt-14-dev zlib1g-dev libssl-dev
      dataset-fashion-mnist gnuplot-nox python3-numpy libdnnl-dev)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3-torch)
fi

missing=()
for p in "${pkgs[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
