"""fa4-tune: an autotuner for FlashAttention-4's SM120 (RTX 5090 / RTX PRO 6000) CuTe-DSL kernels."""
