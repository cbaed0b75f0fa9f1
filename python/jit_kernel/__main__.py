import sys

from jit_kernel.cli import main

sys.exit(main())
