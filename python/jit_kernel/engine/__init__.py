"""The engine that turns a kernel family's spec and a config into a callable function.

- ``spec``, ``families``: what each kernel family is and which configs the wheel prebuilds;
- ``unit``, ``deps``: the translation unit of one config, and the files it includes;
- ``prebuilt``, ``aot``: the prebuilt library (its manifest, and CMake's code generation);
- ``jit``, ``cache``, ``builder``, ``toolchain``: JIT builds, keyed by content in a disk cache;
- ``target``: the GPU a call runs on (arch, SM count, PDL);
- ``dispatch``: config -> function, prebuilt where it fits the target, else JIT;
- ``env``: where the package's files live, and every environment variable it reads.

Nothing here imports torch at module level, so CMake's configure step can run ``aot``.
"""
