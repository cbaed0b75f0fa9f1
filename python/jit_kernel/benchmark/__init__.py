"""Benchmarks. Run each as ``python -m jit_kernel.benchmark.<name>``, or all of them with
``python -m jit_kernel.benchmark.run_all --json-dir DIR``; ``python -m jit_kernel.benchmark.report``
turns their JSON results into docs/benchmarks.md."""
