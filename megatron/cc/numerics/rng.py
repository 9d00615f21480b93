"""A seeded generator that lives on the device of the tensors it draws for.

Stochastic rounding draws its noise where the message is: a CPU generator cannot feed
`torch.rand(..., device="cuda")`, and drawing on the CPU and copying would cost a transfer per
message. The generator is therefore created on first use on the input's device (CUDA and CPU
streams differ, so a run is reproducible on the same kind of device). Its state is training
state: `state_dict()` records the device type with it, and a state saved on one kind of device
is refused on another (a silent re-seed would change the rounding noise without notice).
"""
from __future__ import annotations

import torch


class DeviceGenerator:
    """`get(device)` -> a torch.Generator on that device, seeded with `seed` on first use."""

    def __init__(self, seed: int):
        self.seed = seed
        self._gen: torch.Generator | None = None
        self._pending: dict | None = None

    def get(self, device: torch.device) -> torch.Generator:
        device = torch.device(device)
        if self._gen is None or self._gen.device.type != device.type:
            if self._gen is not None:
                raise RuntimeError(f"stochastic rounding generator lives on {self._gen.device}, "
                                   f"the message is on {device}; keep a codec on one device")
            self._gen = torch.Generator(device=device).manual_seed(self.seed)
            if self._pending is not None:
                self._restore(self._pending)
                self._pending = None
        return self._gen

    def state_dict(self) -> dict:
        if self._gen is None:
            return dict(self._pending) if self._pending is not None else {}
        return {"generator": self._gen.get_state(), "device": self._gen.device.type}

    def load_state_dict(self, sd: dict) -> None:
        if "generator" not in sd:
            return
        if self._gen is None:
            self._pending = dict(sd)   # applied once the device is known
        else:
            self._restore(sd)

    def _restore(self, sd: dict) -> None:
        saved = sd.get("device", "cpu")
        if saved != self._gen.device.type:
            raise RuntimeError(f"stochastic rounding state was saved on {saved} and cannot "
                               f"resume on {self._gen.device.type}; resume on the same kind of "
                               f"device or drop --stochastic-rounding")
        self._gen.set_state(sd["generator"])
