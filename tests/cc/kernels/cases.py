"""Inputs for the kernel tests: small, yet covering partial blocks and every special value."""
import torch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (3, 5, 37): 37 channels = 4 tiles of 8 + 5, 555 values = 69 code bytes-groups + 3 codes.
# (37, 3, 29): 3219 values (two elementwise programs, the second partial); 111 rows per channel
# (two chunks of 64 lanes).
SHAPES = [(3, 5, 37), (37, 3, 29)]


def sample(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    """Heavy-tailed values with per-channel spread, plus: an all-zero channel, exact ties of
    the 4-bit grid (half-integers up to 7.5), a value past the fp16 range (fp32 inputs), and
    tiny values whose scales are fp16 subnormals."""
    g = torch.Generator().manual_seed(seed)
    c = shape[-1]
    x = torch.randn(shape, generator=g) * torch.rand(c, generator=g) * 3
    x = x * torch.randn(shape, generator=g).abs().pow(2)       # heavy tails
    flat = x.view(-1, c)
    flat[:, 1] = 0.0
    flat[:, 2] = torch.randint(-15, 16, (flat.shape[0],), generator=g) * 0.5
    flat[0, 2] = 7.5
    flat[:, 3] *= 1e-6
    flat[-1, 4] = 1e5 if dtype == torch.float32 else 6e4
    return x.to(dtype)
