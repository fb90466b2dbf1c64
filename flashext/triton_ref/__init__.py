"""Triton twins of the CUDA kernels: same names, same loop structure, same formulas.

Read side by side with csrc/kernels/<op>/. On a machine without a GPU they run on CPU tensors
under the Triton interpreter: set TRITON_INTERPRET=1 before importing this package.
"""
