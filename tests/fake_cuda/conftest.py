"""Fixtures of the fake-CUDA tier (see tests/fake_cuda/__init__.py and fake_gpu.py)."""
import pytest

from tests.fake_cuda.fake_gpu import FakeGPU, guard_library


@pytest.fixture
def gpu():
    """One fake GPU, this rank on cuda:0, torch.distributed emulated on gloo (world size 1)."""
    lib = guard_library()
    if isinstance(lib, str):
        pytest.skip(lib)
    with FakeGPU(backend="gloo") as g:
        yield g


@pytest.fixture
def fake_gpu():
    """FakeGPU itself, for tests that choose the backend or the number of GPUs."""
    lib = guard_library()
    if isinstance(lib, str):
        pytest.skip(lib)
    return FakeGPU
