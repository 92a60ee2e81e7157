"""fa4-tune: an autotuner for FlashAttention-4's SM120 (RTX 5090 / RTX PRO 6000) CuTe-DSL kernels."""

from fa4tune import light_imports as _light_imports

_light_imports.install()  # before anything imports flash_attn.cute: 4 s less per process (see the module)
