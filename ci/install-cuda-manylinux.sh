#!/usr/bin/env bash
# cibuildwheel before-all: install the CUDA 13.0 compiler and runtime headers in the
# manylinux_2_28 (AlmaLinux 8) image. Only what the prebuilt library needs: nvcc, cudart, CCCL.
set -euxo pipefail
CUDA_MAJOR=${CUDA_MAJOR:-13}
CUDA_MINOR=${CUDA_MINOR:-0}
dnf install -y dnf-plugins-core
dnf config-manager --add-repo https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo
dnf install -y "cuda-nvcc-${CUDA_MAJOR}-${CUDA_MINOR}" "cuda-cudart-devel-${CUDA_MAJOR}-${CUDA_MINOR}" \
  "cuda-cccl-${CUDA_MAJOR}-${CUDA_MINOR}"
ln -sfn "/usr/local/cuda-${CUDA_MAJOR}.${CUDA_MINOR}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
