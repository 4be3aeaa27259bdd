"""Triton kernels beside their autograd functions and torch references (fused linear + cross-entropy)."""
