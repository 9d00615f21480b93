"""The number formats the codecs and the kernels share, apart from both so that each imports
them without importing the other.

    quant.py  n-bit packing and symmetric fixpoint quantisation (grids, scales, rounding)
    rng.py    DeviceGenerator: seeded draws on the message's device (stochastic rounding)
"""
