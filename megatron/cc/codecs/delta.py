"""AC-SGD activation delta compression ("delta", "delta-lowbits") and its per-sample cache.

Both ends of a forward channel cache the last activation sent for every training sample
(keyed by CodecContext.sample_ids); for an (S, B, H) activation x and the cached c:

    sender:   d = x - c;  payload = fixpoint_b(d);  c <- c + deQ(payload)
    receiver: x_hat = c + deQ(payload);             c <- x_hat

Both sides compute c + deQ with the same float32 operations, so the caches stay bit-identical.
An unseen sample's slot is zero (the first send quantises x itself); `observe(x, ctx)` on both
ends stores x exactly when a message goes uncompressed. Payload: the fixpoint payload of d.
Cache behaviour and sizes: docs/finetune.md.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict

import numpy as np
import torch

from . import fused
from .base import Codec, parse_dtype, register
from .fixpoint import FixpointCodec
from megatron.cc.numerics.quant import dequantize, pack_bits, quantize, unpack_bits


FP16_MAX = 65504.0   # largest finite float16


class CacheTooLarge(ValueError):
    """The activation cache does not fit in the memory or disk space available."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _indexed(device) -> torch.device:
    """torch.device with its index ("cuda" -> "cuda:N", the current one), so that a cache built
    for "cuda" matches the cuda:N its messages report."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class ActivationCache:
    """Per-sample activation store, keyed by dataset sample id, LRU beyond `capacity`.

    Every slot is a row of bytes: a dense (S, H) tensor of `dtype`, or (bits given) packed
    `bits`-bit codes followed by S fp16 per-row scales. Values go in and out as float32.
    Refuses (CacheTooLarge) a cache that does not fit; eviction is deterministic, so both ends
    evict the same sample.

    Args:
        capacity: number of samples held (--max-activation-cache-size).
        sample_shape: (S, H) of one sample's activation.
        dtype: element type of dense storage (ignored when bits is set).
        storage: "ram" (pinned host memory for GPU messages), "device" or "disk:PATH" (a memmap;
            a directory PATH gets a fresh file, removed by close()).
        bits: None for dense storage, else 1..8 (delta-lowbits' bits_act).
        ram_limit_bytes: refuse a RAM cache larger than this (default: MemAvailable).
        device: where values go in and out (the messages' device; default CPU).
    """

    def __init__(self, capacity: int, sample_shape, dtype=torch.float32, storage: str = "ram",
                 bits: int | None = None, ram_limit_bytes: int | None = None, device=None,
                 scheme: str = "fitted"):
        if capacity < 1:
            raise ValueError(f"activation cache capacity must be >= 1, got {capacity}")
        self.capacity, self.sample_shape = capacity, tuple(int(s) for s in sample_shape)
        if len(self.sample_shape) != 2:
            raise ValueError(f"sample_shape must be (seq, hidden), got {sample_shape}")
        self.dtype, self.bits, self.storage = parse_dtype(dtype), bits, storage
        self.scheme = scheme  # quantiser of a low-bit cache (quant.py)
        self.device = _indexed(device)
        self.slot_bytes = self.bytes_per_sample(self.sample_shape, self.dtype, bits)
        self.path: str | None = None
        self._check_fits(ram_limit_bytes)
        self.data = self._allocate()                       # (capacity, slot_bytes) uint8
        self.slots: OrderedDict[int, int] = OrderedDict()  # sample id -> slot, LRU first
        self.evictions = 0

    # ---------------------------------------------------------------- size and allocation
    @staticmethod
    def bytes_per_sample(sample_shape, dtype=torch.float32, bits: int | None = None) -> int:
        s, h = sample_shape
        if bits is None:
            return s * h * torch.empty((), dtype=parse_dtype(dtype)).element_size()
        return -(-s * h // 8) * bits + 2 * h

    @property
    def nbytes(self) -> int:
        return self.capacity * self.slot_bytes

    def describe(self) -> str:
        """One line for the start-up log: what the cache holds, where, and how big it is."""
        what = f"{self.bits}-bit" if self.bits else str(self.dtype).replace("torch.", "")
        where = {"ram": "pinned RAM" if self._pinned else "RAM",
                 "device": f"{self.device} memory"}.get(self.storage, f"disk ({self.path})")
        return (f"activation cache: {self.capacity} samples x {self.sample_shape[0]}x"
                f"{self.sample_shape[1]} {what} in {where} = {_gib(self.nbytes)} "
                f"({self.nbytes:,} bytes)")

    @property
    def _pinned(self) -> bool:
        return self.storage == "ram" and self.device.type == "cuda"

    def _check_fits(self, ram_limit_bytes: int | None) -> None:
        need = self.nbytes
        if self.storage == "device" and self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0]
            if need > free:
                raise CacheTooLarge(
                    f"activation cache needs {_gib(need)} ({need} bytes) of {self.device} memory "
                    f"but only {_gib(free)} is free; lower --max-activation-cache-size, use "
                    f"delta-lowbits or --activation-cache-location ram")
            return
        if self.storage in ("ram", "device"):
            limit = ram_limit_bytes if ram_limit_bytes is not None else mem_available()
            if limit is not None and need > limit:
                raise CacheTooLarge(
                    f"activation cache needs {_gib(need)} ({need} bytes: {self.capacity} samples x "
                    f"{self.slot_bytes} bytes) but only {_gib(limit)} of RAM is available; lower "
                    f"--max-activation-cache-size, use delta-lowbits or disk storage")
            return
        if not self.storage.startswith("disk:") or len(self.storage) == 5:
            raise ValueError(f"storage must be 'ram', 'device' or 'disk:PATH', got "
                             f"{self.storage!r}")
        path = self.storage[5:]
        self._own_file = os.path.isdir(path)
        if self._own_file:
            fd, path = tempfile.mkstemp(prefix="activation_cache_", suffix=".bin", dir=path)
            os.close(fd)
        self.path = path
        have = os.path.getsize(path) if os.path.exists(path) else 0
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free + have
        if need > free:
            raise CacheTooLarge(
                f"activation cache needs {_gib(need)} ({need} bytes) on disk at {path} but only "
                f"{_gib(free)} is free there; lower --max-activation-cache-size or use delta-lowbits")

    def _allocate(self) -> torch.Tensor:
        shape = (self.capacity, self.slot_bytes)
        self._zero_row = torch.zeros(self.slot_bytes, dtype=torch.uint8, device=self.device)
        if self.storage == "device":
            return torch.zeros(shape, dtype=torch.uint8, device=self.device)
        if self.path is None:
            return torch.zeros(shape, dtype=torch.uint8, pin_memory=self._pinned)
        self._memmap = np.memmap(self.path, dtype=np.uint8, mode="w+", shape=shape)
        return torch.from_numpy(self._memmap)  # shares the file's pages

    def close(self) -> None:
        """Flush a disk cache; delete its file if this cache created it in a directory."""
        if self.path is None:
            return
        self._memmap.flush()
        if self._own_file and os.path.exists(self.path):
            self.data = self._memmap = None
            os.remove(self.path)

    # ------------------------------------------------------------------ slots and values
    def assign(self, ids) -> tuple[torch.Tensor, int]:
        """Slots of these sample ids (new ones zeroed, LRU evicted); returns (slots, #new)."""
        ids = [int(i) for i in (ids.tolist() if torch.is_tensor(ids) else ids)]
        if len(set(ids)) > self.capacity:
            raise ValueError(f"{len(set(ids))} distinct samples in one micro-batch exceed the "
                             f"activation cache capacity {self.capacity}")
        for i in ids:
            if i in self.slots:
                self.slots.move_to_end(i)
        fresh = []
        for i in ids:
            if i in self.slots:
                continue
            if len(self.slots) < self.capacity:
                slot = len(self.slots)  # slots are never freed, so the used ones are 0..k-1
            else:
                _, slot = self.slots.popitem(last=False)
                self.evictions += 1
            self.slots[i] = slot
            fresh.append(slot)
        for slot in fresh:  # stream-ordered after any pending write to an evicted slot
            self.data[slot].copy_(self._zero_row, non_blocking=True)
        # slots are host metadata (CPU): reading them never syncs a device
        return torch.tensor([self.slots[i] for i in ids], dtype=torch.long), len(fresh)

    def rows(self) -> torch.Tensor | None:
        """Every slot as (capacity, S, H) fp32, where the kernels can read and update the cache
        in place (dense fp32 in device memory); None elsewhere."""
        if self.storage != "device" or self.bits is not None or self.dtype != torch.float32:
            return None
        return self.data.view(torch.float32).view(self.capacity, *self.sample_shape)

    def _gather_slots(self, slots: torch.Tensor) -> torch.Tensor | None:
        """slots on the device where one gather (or scatter) of rows serves them: a device
        cache and distinct slots (a scatter to a repeated slot has no defined winner)."""
        if self.storage != "device" or len(set(slots.tolist())) != len(slots):
            return None
        return slots.to(self.device, non_blocking=True)

    def _rows(self, slots: torch.Tensor, here, cols: slice) -> torch.Tensor:
        """(B, width) uint8: the bytes `cols` of these slots' rows, contiguous, on `device`;
        here: _gather_slots(slots)."""
        if here is not None:
            return self.data[:, cols].index_select(0, here)
        part = self.data[:, cols]
        rows = torch.empty(len(slots), part.shape[1], dtype=torch.uint8, device=self.device)
        for i, slot in enumerate(slots.tolist()):  # row memcpy (host storage): no gather
            rows[i].copy_(part[slot], non_blocking=True)
        return rows

    def _store_rows(self, slots: torch.Tensor, here, cols: slice, rows: torch.Tensor) -> None:
        if here is not None:
            self.data[:, cols].index_copy_(0, here, rows)
            return
        for i, slot in enumerate(slots.tolist()):  # in order: a repeated slot keeps the last
            self.data[slot, cols].copy_(rows[i], non_blocking=True)

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """(B, S, H) float32 values of these slots, on `device`."""
        b, (s, h) = len(slots), self.sample_shape
        here = self._gather_slots(slots)
        if self.bits is None:
            rows = self._rows(slots, here, slice(None))
            return rows.view(self.dtype).reshape(b, s, h).float()
        ncode = self.slot_bytes - 2 * h
        codes = self._rows(slots, here, slice(0, ncode)).reshape(-1)
        scales = self._rows(slots, here, slice(ncode, None)).view(torch.float16).reshape(-1)
        if (s * h) % 8 == 0:   # no padding between samples: one stream
            # stored channel-major: (B, H, S), one scale per (sample, channel) row
            x = fused.decode(codes, scales, self.bits, (b, h, s), "tile", s, torch.float32,
                             self.scheme)
            return x.transpose(1, 2)
        codes = unpack_bits(codes, self.bits, b * ncode * 8 // self.bits)
        codes = codes.view(b, -1)[:, :s * h]
        x = dequantize(codes, scales, self.bits, (b, h, s), "tile", s, scheme=self.scheme)
        return x.transpose(1, 2)

    def write(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Store (B, S, H) float32 values into these slots (cast or quantised)."""
        b, (s, h) = values.shape[0], self.sample_shape
        if self.bits is None:
            if self.dtype == torch.float16:  # saturate: an inf cached would poison every delta
                values = values.clamp(-FP16_MAX, FP16_MAX)
            rows = values.to(self.dtype).reshape(b, -1).contiguous().view(torch.uint8)
            self._store_rows(slots, self._gather_slots(slots), slice(None), rows)
            return
        ncode = self.slot_bytes - 2 * h
        if (s * h) % 8 == 0:   # every sample starts a group of 8 codes: one stream
            # channel-major (B, H, S): one scale per (sample, channel) row; on CUDA the fused
            # kernels (scales, quantise + pack), eager elsewhere
            packed, scales = fused.encode(values.transpose(1, 2), self.bits, "tile", s,
                                          torch.float16, self.scheme)
            packed = packed.view(b, -1)
        else:
            codes, scales = quantize(values.transpose(1, 2), self.bits, "tile", s,
                                     scheme=self.scheme)
            codes = codes.reshape(b, -1)
            pad = -codes.shape[1] % 8  # whole bytes per sample
            if pad:
                codes = torch.cat([codes, codes.new_zeros(b, pad)], dim=1)
            packed = pack_bits(codes, self.bits).view(b, -1)
        here = self._gather_slots(slots)
        self._store_rows(slots, here, slice(0, ncode), packed)
        self._store_rows(slots, here, slice(ncode, None), scales.view(b, h).view(torch.uint8))

    def _settle(self) -> None:
        """Wait for pending asynchronous copies (checkpointing only: the host reads the data)."""
        if self._pinned:
            torch.cuda.current_stream(self.device).synchronize()

    # -------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        entries = torch.tensor(list(self.slots.items()), dtype=torch.long).reshape(-1, 2)
        self._settle()
        if self.path is not None:
            self._memmap.flush()
        return {"sample_shape": self.sample_shape, "entries": entries,
                "data": self.data[entries[:, 1].to(self.data.device)].cpu().clone(),
                "evictions": self.evictions,
                "path": self.path, "format": self._format}

    @property
    def _format(self) -> str:
        return slot_format(self.dtype, self.bits)

    def load_state_dict(self, sd: dict, settle: bool = True) -> None:
        """settle=False: this cache was built just now (no copies in flight to wait for)."""
        if tuple(sd["sample_shape"]) != self.sample_shape:
            raise ValueError(f"cache state is for samples {tuple(sd['sample_shape'])}, "
                             f"this cache holds {self.sample_shape}; at tp > 1 a pipeline "
                             f"message is a 1/tp sequence slice unless "
                             f"--no-scatter-gather-tensors-in-pipeline: resume with the setting "
                             f"the checkpoint was written with")
        check_format(sd, self._format)
        entries = sd["entries"]
        if entries.shape[0] > self.capacity or sd["data"].shape[1] != self.slot_bytes:
            raise ValueError(
                f"cache state ({entries.shape[0]} samples of {sd['data'].shape[1]} bytes) does "
                f"not fit this cache ({self.capacity} samples of {self.slot_bytes} bytes); "
                f"resume with the --max-activation-cache-size / --activation-cache-dtype / "
                f"--forward-bits-act the checkpoint was written with (before "
                f"--activation-cache-dtype existed the cache was fp32)")
        slots = sorted(entries[:, 1].tolist())
        if slots != list(range(len(slots))):
            raise ValueError("cache state's slots are not 0..k-1")
        if settle:
            self._settle()
        self.data.zero_()
        self.slots = OrderedDict((int(i), int(s)) for i, s in entries.tolist())  # LRU order kept
        if slots:
            self.data[entries[:, 1].to(self.data.device)] = sd["data"].to(self.data.device)
        self.evictions = int(sd.get("evictions", 0))


def slot_format(dtype, bits) -> str:
    """What a cache slot holds: 'float32' / 'float16' / 'bfloat16', or 'N-bit/channel'
    (earlier releases: 'N-bit' or no name, one scale per token, refused)."""
    return f"{bits}-bit/channel" if bits else str(parse_dtype(dtype)).replace("torch.", "")


def check_format(sd: dict, want: str) -> None:
    have = sd.get("format", "per-token low-bit" if want.endswith("/channel") else want)
    if have != want:
        raise ValueError(f"cache state holds {have} values, this cache "
                         f"{want}; resume with the --activation-cache-dtype / "
                         f"--forward-bits-act the checkpoint was written with")


@register("delta")
class DeltaCodec(Codec):
    """AC-SGD delta compression of (S, B, H) activations against a per-sample cache.

    Args:
        bits: bits per delta value (--forward-bits).
        capacity: samples in the cache (--max-activation-cache-size).
        sample_shape: (S, H); None = taken from the first message.
        cache_dtype: dense cache element type ("float32", "float16", "bfloat16").
        storage: "ram", "device" or "disk:PATH".
        device: the messages' device, when the cache is built before the first message
            (sample_shape given); otherwise the first message's device.
        granularity, group_size: fixpoint groups of the delta (default per hidden channel).
        bits_act: None = dense cache; 1..8 = cache quantised to that many bits (delta-lowbits).
        ram_limit_bytes: refuse a RAM cache bigger than this (default: MemAvailable).
        stochastic, seed: stochastic rounding of the delta on the sender (the receiver only
            dequantises, so the caches stay identical); the generator is in state_dict.
        scheme: quantiser of the delta and of a low-bit cache (quant.py).
    """

    name = "delta"

    def __init__(self, bits: int = 4, capacity: int = 1024, sample_shape=None,
                 cache_dtype="float32", storage: str = "ram", granularity: str = "channel",
                 group_size: int = 128, bits_act: int | None = None,
                 ram_limit_bytes: int | None = None, stochastic: bool = False, seed: int = 0,
                 device=None, scheme: str = "fitted"):
        self.q = FixpointCodec(bits, granularity, group_size, stochastic=stochastic, seed=seed,
                               scheme=scheme)
        self.cache_args = dict(capacity=capacity, dtype=cache_dtype, storage=storage,
                               bits=bits_act, ram_limit_bytes=ram_limit_bytes, scheme=scheme)
        self.cache: ActivationCache | None = None
        self.device = device
        self._pending_cache: dict | None = None   # loaded before the cache's device was known
        if sample_shape is not None:
            self.cache = ActivationCache(sample_shape=sample_shape, device=device,
                                         **self.cache_args)
        self.first_sights = 0  # samples sent against an empty slot so far

    def _cache(self, shape, ids, device) -> tuple[ActivationCache, torch.Tensor]:
        if len(shape) != 3:
            raise ValueError(f"delta codecs take (S, B, H) activations, got shape {tuple(shape)}")
        if ids is None or len(ids) != shape[1]:
            raise ValueError(f"delta codecs need ctx.sample_ids with one id per sample "
                             f"(B={shape[1]}), got {None if ids is None else len(ids)}")
        if self.cache is None:
            self.cache = ActivationCache(sample_shape=(shape[0], shape[2]), device=device,
                                         **self.cache_args)
            if self._pending_cache is not None:   # a resumed cache lands where it serves
                pending, self._pending_cache = self._pending_cache, None
                self.cache.load_state_dict(pending, settle=False)
        if self.cache.device != _indexed(device):
            raise ValueError(f"the activation cache serves {self.cache.device}, this message is "
                             f"on {device}; build the codec with device={device}")
        if self.cache.sample_shape != (shape[0], shape[2]):
            raise ValueError(f"activation of shape {tuple(shape)} does not match the cache's "
                             f"samples {self.cache.sample_shape}")
        slots, fresh = self.cache.assign(ids)
        self.first_sights += fresh
        return self.cache, slots

    def describe(self) -> str:
        return self.cache.describe() if self.cache else "activation cache: allocated on first use"

    def payload_spec(self, shape, dtype):
        return self.q.payload_spec(shape, dtype)

    def _in_place(self, cache: ActivationCache, slots: torch.Tensor, t: torch.Tensor):
        """(rows, slots on t's device) where the kernels update the cache in place: a dense
        fp32 device cache and distinct samples; else None."""
        from megatron.cc.codecs import delta_kernels as fused_delta
        rows = cache.rows()
        if rows is None or not fused_delta.in_cache(self.q, t, rows):
            return None
        if len(set(slots.tolist())) != len(slots):   # host metadata: no device read
            return None
        return rows, slots.to(t.device, non_blocking=True)

    def encode(self, x, ctx):
        cache, slots = self._cache(x.shape, ctx.sample_ids, x.device)
        from megatron.cc.codecs import delta_kernels as fused_delta
        here = self._in_place(cache, slots, x)
        if here is not None:
            return fused_delta.encode_in_cache(x, *here, self.q)
        prev = cache.read(slots).transpose(0, 1)          # (S, B, H) view of our own copy
        # quantise the delta, pack, and prev += deQ (the op decode repeats): one Triton pass
        # on CUDA, these eager steps elsewhere (codecs/delta_kernels.py)
        payload, new = fused_delta.encode_update(x, prev, self.q)
        cache.write(slots, new.transpose(0, 1))
        return payload

    def decode(self, payload, shape, dtype, ctx):
        cache, slots = self._cache(shape, ctx.sample_ids, payload[0].device)
        from megatron.cc.codecs import delta_kernels as fused_delta
        here = self._in_place(cache, slots, payload[0])
        if here is not None:
            return fused_delta.decode_in_cache(payload, *here, self.q, shape, dtype)
        prev = cache.read(slots).transpose(0, 1)
        x_hat = fused_delta.decode_update(payload, prev, self.q, shape, dtype)
        cache.write(slots, prev.transpose(0, 1))   # prev holds x_hat in fp32 now
        return x_hat

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    def observe(self, x: torch.Tensor, ctx) -> None:
        """Record an activation that went uncompressed (call on both ends, same x)."""
        cache, slots = self._cache(x.shape, ctx.sample_ids, x.device)
        cache.write(slots, x.float().transpose(0, 1))

    def state_dict(self):
        cache = self._pending_cache if self.cache is None else self.cache.state_dict()
        return {"cache": cache, "first_sights": self.first_sights,
                "quantizer": self.q.state_dict()}

    def load_state_dict(self, sd):
        self.first_sights = int(sd.get("first_sights", 0))
        self.q.load_state_dict(sd.get("quantizer", {}))
        if sd.get("cache") is None:
            return
        if self.cache is None and self.device is None:
            # the device is the first message's: build the cache there, then load (a cache
            # built now would sit on the CPU and refuse a GPU's messages)
            check_format(sd["cache"], slot_format(self.cache_args["dtype"],
                                                  self.cache_args["bits"]))
            self._pending_cache = sd["cache"]
            return
        if self.cache is None:
            self.cache = ActivationCache(sample_shape=sd["cache"]["sample_shape"],
                                         device=self.device, **self.cache_args)
        self.cache.load_state_dict(sd["cache"])


@register("delta-lowbits")
class DeltaLowbitsCodec(DeltaCodec):
    """`delta` with the cache stored at bits_act bits (--forward-bits-act), per-token scales."""

    name = "delta-lowbits"

    def __init__(self, bits: int = 4, bits_act: int = 8, **kwargs):
        super().__init__(bits=bits, bits_act=bits_act, **kwargs)
