"""Where a training process runs: device, precision, CPU threads, and its place in a `torchrun` job (DDP).

GPU-first: on CUDA it enables TF32 matmuls and picks bf16 autocast; on CPU it stays in fp32 and only sets the
thread count. Under `torchrun` (WORLD_SIZE > 1) it joins the process group: NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """Where and how this process runs."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_process_group: bool = False  # this Runtime initialized the process group and must destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def ddp(self) -> bool:
        return self.world_size > 1

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """bf16 on CUDA; None (plain fp32) elsewhere."""
        return torch.bfloat16 if self.device.type == "cuda" else None

    def autocast(self):
        dtype = self.autocast_dtype
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

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


def resolve_device(name: str, local_rank: int = 0, world_size: int = 1) -> torch.device:
    """`"auto"` means CUDA when there is one; under DDP each process takes the GPU of its local rank."""
    want = name
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for CUDA, but no CUDA device is available; use --device cpu")
    if not (want == "cpu" or want.startswith("cuda")):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    if want == "cuda" and world_size > 1:
        want = f"cuda:{local_rank}"
    return torch.device(want)


def setup_runtime(device: str = "auto", threads: int = 0) -> Runtime:
    """Reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), picks the device and joins the process group."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank, world_size)
    if threads:
        torch.set_num_threads(threads)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls (autocast covers most of them anyway)
        torch.backends.cudnn.allow_tf32 = True
    owns = False
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=dev if dev.type == "cuda" else None)
        owns = True
        logger.debug("rank %d/%d joined the %s process group", rank, world_size, backend)
    return Runtime(dev, rank, world_size, local_rank, owns)
