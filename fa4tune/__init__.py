"""fa4-tune: an autotuner for FlashAttention-4's SM120 (RTX 5090 / RTX PRO 6000) CuTe-DSL kernels.

`fa4tune.flash_attn_func` and `fa4tune.flash_attn_varlen_func` are fa4tune.dropin's (flash-attn-4's parameters,
tuned), loaded on first use (PEP 562) so that `import fa4tune` stays light: it imports neither torch nor the CuTe DSL.
"""

from fa4tune import light_imports as _light_imports

_light_imports.install()  # before anything imports flash_attn.cute: 4 s less per process (see the module)

DROPIN = ("flash_attn_func", "flash_attn_varlen_func")  # fa4tune.dropin's public functions, as upstream names them


def __getattr__(name: str):
    """fa4tune.dropin's functions on first use (its import pulls in torch)."""
    if name in DROPIN:
        from fa4tune import dropin

        return getattr(dropin, name)
    raise AttributeError(f"module 'fa4tune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *DROPIN])
