#!/usr/bin/env bash
# gpu-deps.sh - fleet's build libraries on a GPU machine that has the CUDA toolkit (nvcc,
# cuBLAS, cuDNN and NCCL, as system copies or PyTorch's wheels) but not Debian's -dev packages
# and no network, such as a rented machine with only PyTorch's image. Two steps:
#
#   scripts/gpu-deps.sh download DIR        on a Debian 12 machine with apt: the .debs of
#                                           OpenBLAS (OpenMP), libyaml, libjpeg-turbo, zlib,
#                                           OpenSSL's libcrypto and pkgconf into DIR (about
#                                           17 MB; GPU_DEPS_DATA=1 adds Debian's
#                                           dataset-fashion-mnist, 31 MB, for gpu-check.sh
#                                           --accuracy); copy DIR over
#   eval "$(scripts/gpu-deps.sh unpack DIR ROOT)"
#                                           on the GPU machine: unpacks them under ROOT (never
#                                           under /, whose own libraries stay as they are) and
#                                           prints the exports with which cmake, pkg-config and
#                                           the built programs find them there
#
# Then configure as usual, without oneDNN and MPI (not brought): cmake -S . -B build
# -DFLEET_ONEDNN=OFF -DCMAKE_CUDA_ARCHITECTURES=90. bench/gpu_step.sh runs these steps itself.
set -euo pipefail

debs=(libopenblas0-openmp libopenblas-openmp-dev libyaml-0-2 libyaml-dev libjpeg62-turbo
      libjpeg62-turbo-dev zlib1g-dev libssl-dev libssl3 libgfortran5 pkgconf pkgconf-bin
      libpkgconf3)
arch=x86_64-linux-gnu

usage() {
    echo "usage: $0 download DIR | unpack DIR ROOT" >&2
    exit 2
}

case "${1:-}" in
download)
    [[ $# -eq 2 ]] || usage
    mkdir -p "$2"
    [[ ${GPU_DEPS_DATA:-0} == 1 ]] && debs+=(dataset-fashion-mnist)
    (cd "$2" && apt-get download "${debs[@]}" >/dev/null)
    echo "gpu-deps: $(ls "$2"/*.deb | wc -l) packages in $2" >&2
    ;;
unpack)
    [[ $# -eq 3 ]] || usage
    dir=$2 root=$3
    shopt -s nullglob
    files=("$dir"/*.deb)
    [[ ${#files[@]} -gt 0 ]] || { echo "gpu-deps: no .deb in $dir (run: $0 download $dir)" >&2; exit 1; }
    mkdir -p "$root"
    for f in "${files[@]}"; do
        dpkg-deb -x "$f" "$root" || { echo "gpu-deps: cannot unpack $f" >&2; exit 1; }
    done
    lib=$root/usr/lib/$arch
    # zlib1g-dev's libz.so points at Debian's libz.so.1.x, which is not brought: the
    # machine's own libz.so.1 serves (every system has one)
    sysz=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/ && !f {print $NF; f = 1}')
    [[ -n "$sysz" ]] && ln -sf "$sysz" "$lib/libz.so"
    # libgfortran.so.5 (OpenBLAS needs it) and libcrypto.so.3 (the AEAD frames) only where the
    # machine has none: a private folder, so that the loader path brings nothing else of
    # Debian's in front of the system's
    runtime=$root/runtime
    mkdir -p "$runtime"
    for so in libgfortran.so.5 libcrypto.so.3; do
        ldconfig -p | grep "${so//./\\.} " >/dev/null || ln -sf "$lib/$so" "$runtime/$so"
    done
    echo "export PKG_CONFIG_LIBDIR='$lib/pkgconfig:$root/usr/share/pkgconfig'"
    echo "export PKG_CONFIG_SYSROOT_DIR='$root' PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1"
    echo "export CPATH='$root/usr/include:$root/usr/include/$arch'\${CPATH:+:\$CPATH}"
    echo "export CMAKE_LIBRARY_PATH='$lib/openblas-openmp:$lib'"
    echo "export CMAKE_INCLUDE_PATH='$root/usr/include/$arch/openblas-openmp:$root/usr/include'"
    echo "export LD_LIBRARY_PATH='$lib/openblas-openmp:$runtime'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    if ! command -v pkg-config >/dev/null; then
        echo "export PATH='$root/usr/bin':\$PATH"
        echo "export LD_LIBRARY_PATH='$lib/libpkgconf-only'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
        mkdir -p "$lib/libpkgconf-only"
        ln -sf "$lib"/libpkgconf.so.3* "$lib/libpkgconf-only/" 2>/dev/null || true
    fi
    ;;
*) usage ;;
esac
