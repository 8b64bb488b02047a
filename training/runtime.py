"""Where a training process runs: device, precision, CPU threads, and its place in a `torchrun` job (DDP).

GPU-first: on CUDA the default precision (`"auto"`) is bf16 autocast with TF32 for the matmuls left in fp32; on
CPU it is plain fp32. `"bf16"` asks for bf16 autocast on either device, `"fp32"` for plain fp32 (no TF32) on
either. Under `torchrun` (any number of processes, one included) it joins the process group: NCCL on GPUs, gloo on
CPU.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import PRECISIONS

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """Where and how this process runs."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    autocast_dtype: torch.dtype | None = None  # None: plain fp32
    ddp: bool = False  # part of a torchrun job (in a process group), even one of a single process
    owns_process_group: bool = False  # this Runtime initialized the process group and must destroy it
    threads: int = 0  # PyTorch's intra-op threads for training, as set up (generation may change the count later)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def precision(self) -> str:
        """`"bf16 autocast"` or `"fp32"`, with `" + TF32"` where fp32 matmuls use TF32 (CUDA's default)."""
        name = "bf16 autocast" if self.autocast_dtype == torch.bfloat16 else "fp32"
        tf32 = self.device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"
        return name + (" + TF32" if tf32 else "")

    def describe(self) -> str:
        """One line: device, precision and the DDP job, e.g. `cuda:0 (NVIDIA H200), bf16 autocast + TF32`."""
        where = str(self.device)
        if self.device.type == "cuda":
            where += f" ({torch.cuda.get_device_name(self.device)})"
        line = f"{where}, {self.precision}"
        if self.ddp:
            backend = dist.get_backend() if dist.is_initialized() else "?"
            line += f", DDP over {backend}, {self.world_size} process{'es' if self.world_size > 1 else ''}"
        return line

    def autocast(self):
        dtype = self.autocast_dtype
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    def synchronize(self) -> None:
        """Waits for the work queued on the GPU (CUDA runs asynchronously); nothing on CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def all_gather_object(self, obj) -> list:
        """`obj` of every rank, in rank order (just `[obj]` outside DDP)."""
        if not self.ddp:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """Mean of a scalar tensor over the ranks."""
        if self.ddp:
            value = value.clone()
            dist.all_reduce(value)
            value /= self.world_size
        return value

    def barrier(self) -> None:
        if self.ddp:
            dist.barrier()

    def close(self) -> None:
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_process_group = False


_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`"auto"` means CUDA when there is one; `"cuda"` is the GPU of the local rank (under torchrun; else 0)."""
    if not _DEVICE.fullmatch(name):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    want = name
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for CUDA, but no CUDA device is available; use --device cpu")
    if want == "cuda":
        want = f"cuda:{local_rank}"  # an index always: torch.cuda.set_device and DDP's device_ids need one
    device = torch.device(want)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {want!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s), "
            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return device


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of `precision` on `device`: bf16, or None for plain fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return torch.bfloat16 if precision == "bf16" else None


def setup_runtime(device: str = "auto", threads: int = 0, precision: str = "auto") -> Runtime:
    """Reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), picks the device and precision, and joins the
    process group when torchrun launched this process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    autocast_dtype = resolve_precision(precision, dev)
    if threads:
        torch.set_num_threads(threads)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        # TF32 for the matmuls autocast leaves in fp32, unless plain fp32 was asked for
        torch.set_float32_matmul_precision("highest" if precision == "fp32" else "high")
        torch.backends.cudnn.allow_tf32 = precision != "fp32"
    ddp = world_size > 1 or dist.is_torchelastic_launched()
    owns = False
    if ddp and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=dev if dev.type == "cuda" else None)
        owns = True
        logger.debug("rank %d/%d joined the %s process group", rank, world_size, backend)
    return Runtime(dev, rank, world_size, local_rank, autocast_dtype, ddp, owns, torch.get_num_threads())
