"""calpipe's tests.

numpy picks its SIMD kernels at run time, and its AVX-512 ones (X86_V4) round some sums, logs
and exps differently in the last bit from its AVX2 ones (X86_V3). The golden tables
(``tests/golden``) hold bits, so every test process, and the golden tables' maker, runs numpy's
AVX2 kernels: set here, before numpy is imported (a machine without AVX-512 is unchanged).
Found when a session on an AVX-512 machine saw every golden table differ in the last bit.
"""

import os

os.environ.setdefault("NPY_DISABLE_CPU_FEATURES", "X86_V4 AVX512_ICL AVX512_SPR")
