"""Benchmarks. Run each as ``python -m jit_kernel.benchmark.<name>``; results go to docs/benchmarks.md."""
