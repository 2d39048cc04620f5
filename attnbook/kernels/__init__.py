"""Triton GPU kernels (FlashAttention, block-sparse, decoding). Imported lazily: ``triton`` is optional."""
