"""Where training runs: device names, precision, torch.compile and a one-process torchrun job, checked on CPU.

The CUDA paths themselves (bf16 autocast, TF32, fused AdamW, NCCL) need a GPU: `benchmarks/gpu_check.sh` runs them.
These are their CPU stand-ins: the same code with CUDA's answers faked, or the same feature on the CPU.
"""

from __future__ import annotations

import shutil
import socket

import pytest
import torch
import torch.distributed as dist

from training.report import hardware
from training.runtime import resolve_device, resolve_precision
from training.trainer import TrainConfig, Trainer

CPU, CUDA = torch.device("cpu"), torch.device("cuda:0")


@pytest.fixture
def two_fake_gpus(monkeypatch):
    """torch.cuda reports two devices (nothing is run on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cuda_devices_always_get_an_index(two_fake_gpus):
    # torch.cuda.set_device and DDP's device_ids refuse an index-less "cuda"
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda:0")
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda:1")  # torchrun's LOCAL_RANK
    assert resolve_device("cuda:1") == torch.device("cuda:1") and resolve_device("cpu") == CPU
    with pytest.raises(ValueError, match=r"'cuda:2' does not exist: this machine has 2 CUDA device\(s\)"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("name", ["gpu", "cudax", "cuda:", "cuda:a", "CPU"])
def test_bad_device_names_are_refused_by_name(name):
    with pytest.raises(ValueError, match=f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got '{name}'"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_clear_error(name):
    with pytest.raises(ValueError, match=f"device '{name}' asked for CUDA, but no CUDA device is available"):
        resolve_device(name)


def test_precision():
    assert resolve_precision("auto", CUDA) == torch.bfloat16 and resolve_precision("auto", CPU) is None
    assert resolve_precision("bf16", CPU) == torch.bfloat16 and resolve_precision("fp32", CUDA) is None
    with pytest.raises(ValueError, match=r"precision must be one of \('auto', 'bf16', 'fp32'\), got 'fp16'"):
        resolve_precision("fp16", CPU)
    with pytest.raises(ValueError, match="--precision must be one of"):
        TrainConfig(precision="fp16").validate()


def _losses(trainer: Trainer, steps: int) -> torch.Tensor:
    return torch.stack([trainer.train_step() for _ in range(steps)])


def test_bf16_autocast_trains_on_cpu_close_to_fp32(tmp_path, make_config):
    """`--precision bf16` runs the CUDA default's autocast path through the trainer, on CPU."""
    fp32 = Trainer(make_config(tmp_path / "fp32", model={"dropout": 0.0}))
    bf16 = Trainer(make_config(tmp_path / "bf16", precision="bf16", model={"dropout": 0.0}))
    assert bf16.rt.autocast_dtype == torch.bfloat16 and fp32.rt.autocast_dtype is None
    assert bf16.describe_setup() == "cpu, bf16 autocast, AdamW, eager"
    assert bf16.model.config._attn_implementation == "sdpa"  # the fp32 CPU kernels stay out of bf16
    x, y = bf16.dataset.get_batch("train", 2, torch.Generator())
    with bf16.rt.autocast():
        assert bf16.model(input_ids=x, use_cache=False).logits.dtype == torch.bfloat16
    assert bf16.loss_on(x, y).dtype == torch.float32
    want, got = _losses(fp32, 8), _losses(bf16, 8)
    assert torch.isfinite(got).all() and got[-1] < got[0] - 0.2
    torch.testing.assert_close(got, want, rtol=0, atol=0.03)


@pytest.mark.slow  # ~30 s with a cold inductor cache on 2 loaded cores (~6 s warm)
@pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("c++")),
    reason="torch.compile's inductor backend builds C++ kernels on CPU, and no C++ compiler (g++/c++) is on PATH",
)
def test_compile_on_cpu_gives_the_eager_losses(tmp_path, make_config):
    """`--compile` (on by default on CUDA) through inductor on CPU: the same losses as eager mode.

    One layer keeps the compilation short; no dropout, since compiled dropout draws from its own RNG."""
    model = {"dropout": 0.0, "n_layer": 1}
    eager = Trainer(make_config(tmp_path / "eager", model=model))
    compiled = Trainer(make_config(tmp_path / "compiled", compile=True, model=model))
    assert compiled.forward_model is not compiled.model and compiled.describe_setup().endswith("torch.compile")
    assert compiled.model.config._attn_implementation == "sdpa"  # the CPU kernels are eager-only
    # each loss after the first is computed with the weights the previous compiled steps updated
    torch.testing.assert_close(_losses(compiled, 3), _losses(eager, 3), rtol=1e-5, atol=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_one_process_torchrun_job_trains_with_ddp(tmp_path, make_config, monkeypatch):
    """`torchrun --nproc_per_node=1` joins a process group of one and wraps the model in DDP (on one GPU, that is
    how NCCL gets exercised); this is torchrun's environment for such a job, on CPU (gloo)."""
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    for key, value in {**env, "MASTER_PORT": str(_free_port()), "TORCHELASTIC_RUN_ID": "pytest"}.items():
        monkeypatch.setenv(key, value)
    trainer = Trainer(make_config(tmp_path, max_iters=2, eval_interval=2, eval_iters=1, sample_tokens=0))
    try:
        assert trainer.rt.ddp and trainer.rt.owns_process_group and dist.get_backend() == "gloo"
        assert isinstance(trainer.ddp_model, torch.nn.parallel.DistributedDataParallel)
        assert trainer.describe_setup() == "cpu, fp32, DDP over gloo, 1 process, AdamW, eager"
        assert hardware(trainer.rt).startswith("1 DDP process x ")
        assert trainer.fit()["final_step"] == 2
    finally:
        trainer.rt.close()
    assert not dist.is_initialized()
