"""GPU readiness: runs the CUDA paths of training and ONNX Runtime once, on one NVIDIA GPU (`gpu_check.sh` runs it).

    python benchmarks/gpu_check.py --out OUT [--work DIR] [--data PATH] [--steps 2000]
    python benchmarks/gpu_check.py --rehearse-on-cpu --out OUT     # the same checks on CPU, to test this script

Each check runs in its own process group under a time limit and prints one PASS/FAIL/SKIP line with its figures:

- train: stage F of the ladder (`python -m training --preset ladder-f`, 10.8M parameters) for `--steps` steps with
  the CUDA defaults (bf16 autocast + TF32, fused AdamW, torch.compile). PASS: the run says it used all three, every
  evaluation's val loss is finite and below the one before, and the last is under 2.0 (stage E, the ladder's best
  small model, ends at 2.06 after 5000 steps; the lesson's full 5000-step stage F run reaches 1.48). 2000 steps,
  40% of that run, fit the time budget with room for the compilation; tokens/s is over the last 500 steps.
- ddp: the same entry point under `torchrun --standalone --nproc_per_node=1`: a process group of one over NCCL, the
  model DDP-wrapped and compiled, 30 steps. PASS: it ran over NCCL and the val loss fell.
- onnx-cuda: ONNX Runtime's CUDAExecutionProvider against its CPU provider on the shipped model's fp32
  `onnx/model.onnx` (`OnnxBackend`, KV cache kept on the GPU): a left-padded prefill and 16 greedy decode steps.
  PASS: max |Δlogits| <= 1e-4 (the export's own fp32 limit) with TF32 off. SKIP without `onnxruntime-gpu`.
- serve-cuda: the scheduler (continuous batching) on the shipped model in PyTorch on the GPU: one stream of 200
  tokens, then 16 at once (refill mode, as `benchmarks/serving.py` runs them). PASS: all complete, and the serving
  issue's target holds: 16 streams' aggregate >= 8x one stream's, each stream >= half of one alone (on the 2-core
  CPU development machine it is not met: README, "Many streams at once"). In a rehearsal: all complete.

Writes OUT/gpu_check.json (lines, figures, versions) and OUT/<check>.log (each check's stderr); the training runs
go to --work. Exit status: 0 when nothing failed, 1 when a check failed, 2 when there is nothing to check on (no
GPU, or a missing requirement).

--rehearse-on-cpu runs the same orchestration on CPU: the tiny preset in fp32, DDP over gloo, and the CPU provider
against itself. It proves the script, not the GPU paths (tests/benchmarks runs it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
ONNX_ATOL = 1e-4  # = export.validate.FP32_LOGITS_ATOL (not imported: this environment may lack onnx)
LIMITS_S = {"train": 240, "ddp": 150, "onnx-cuda": 60, "serve-cuda": 60}  # with ~10 s of preflight: under 9
# minutes in all
SERVE_TOKENS, SERVE_STREAMS = 200, 16


@dataclass(frozen=True)
class Plan:
    device: str
    preset: str
    steps: int
    eval_iters: int
    max_val_loss: float
    expect: tuple[str, ...]  # what the trainer's "training on ..." line must name
    ddp_steps: int
    ddp_backend: str
    extra: tuple[str, ...] = ()


GPU = Plan("cuda", "ladder-f", 2000, 200, 2.0, ("bf16 autocast + TF32", "fused AdamW", "torch.compile"), 30, "nccl")
CPU = Plan("cpu", "tiny", 40, 4, 3.6, ("cpu, fp32", "AdamW", "eager"), 4, "gloo", ("--threads", "1"))


@dataclass
class Result:
    check: str
    status: str  # PASS, FAIL or SKIP
    summary: str
    figures: dict

    @property
    def line(self) -> str:
        return f"{self.status} {self.check}: {self.summary}"


def run(cmd: list[str], limit_s: float, log: Path) -> tuple[int | None, str]:
    """(exit status, or None when `limit_s` ran out; stdout); stderr goes to `log`.

    A process past its limit gets SIGTERM (torchrun then stops its workers, which run in sessions of their own),
    and SIGKILL 15 s later."""
    with open(log, "w", encoding="utf-8") as err, open(log.with_suffix(".stdout"), "w+", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.seek(0)
        return (None if timed_out else proc.returncode), out.read()


def failed_run(check: str, rc: int | None, limit_s: float, log: Path) -> Result:
    if rc is None:
        return Result(check, "FAIL", f"still running after {limit_s:.0f} s, killed (log: {log})", {})
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    return Result(check, "FAIL", f"exit status {rc}: {last[:300]} (log: {log})", {})


def read_metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


def setup_line(log: Path) -> str:
    """The trainer's `training on ...` line (device, precision, DDP, optimizer, compilation)."""
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("training on "):
            return line.removeprefix("training on ")
    return ""


def training_args(plan: Plan, out: Path, steps: int, eval_interval: int, data: Path | None) -> list[str]:
    args = ["-m", "training", "--preset", plan.preset, "--device", plan.device, "--out", str(out)]
    args += ["--max-iters", str(steps), "--eval-interval", str(eval_interval), "--eval-iters", str(plan.eval_iters)]
    args += ["--progress", "false", "--sample-tokens", "100", *plan.extra]
    return args + (["--data", str(data)] if data else [])


def check_train(plan: Plan, steps: int, work: Path, out: Path, data: Path | None) -> Result:
    folder, log = work / "train", out / "train.log"
    shutil.rmtree(folder, ignore_errors=True)
    interval = max(1, steps // 4)
    rc, _ = run([sys.executable, *training_args(plan, folder, steps, interval, data)], LIMITS_S["train"], log)
    if rc != 0:
        return failed_run("train", rc, LIMITS_S["train"], log)
    setup, metrics = setup_line(log), read_metrics(folder)
    if len(metrics) < 2:
        return Result("train", "FAIL", f"exit status 0 but {len(metrics)} evaluations in {folder}/metrics.jsonl", {})
    val = [m["val_loss"] for m in metrics]
    figures = {
        "setup": setup,
        "steps": steps,
        "val_loss": dict(zip([m["step"] for m in metrics], val)),
        "tokens_per_s": metrics[-1].get("tokens_per_s"),  # over the last eval interval: compiled, warm
        "first_interval_s": metrics[1]["time_s"],  # the compilation included
        "train_time_s": metrics[-1]["time_s"],
    }
    missing = [name for name in plan.expect if name not in setup]
    falls = all(math.isfinite(v) for v in val) and all(b < a for a, b in zip(val, val[1:]))
    passed = not missing and falls and val[-1] < plan.max_val_loss
    curve = ", ".join(f"{v:.3f}" for v in val)
    summary = (
        f"{plan.preset}, {steps} steps on {setup or '?'}: val loss {curve} (every {interval} steps; PASS needs it "
        f"falling and < {plan.max_val_loss}); {figures['tokens_per_s'] or 0:,.0f} tok/s over the last {interval} "
        f"steps; the first {interval} took {figures['first_interval_s'] or 0:.1f} s, compilation included"
    )
    if missing:
        summary += f"; the run did not use {missing}"
    return Result("train", "PASS" if passed else "FAIL", summary, figures)


def check_ddp(plan: Plan, work: Path, out: Path, data: Path | None) -> Result:
    folder, log = work / "ddp", out / "ddp.log"
    shutil.rmtree(folder, ignore_errors=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    rc, _ = run([*torchrun, *training_args(plan, folder, plan.ddp_steps, plan.ddp_steps, data)], LIMITS_S["ddp"], log)
    if rc != 0:
        return failed_run("ddp", rc, LIMITS_S["ddp"], log)
    setup, metrics = setup_line(log), read_metrics(folder)
    val = [m["val_loss"] for m in metrics]
    wanted = f"DDP over {plan.ddp_backend}, 1 process"
    passed = wanted in setup and len(val) == 2 and math.isfinite(val[1]) and val[1] < val[0]
    figures = {"setup": setup, "steps": plan.ddp_steps, "val_loss": val}
    losses = " -> ".join(f"{v:.3f}" for v in val)
    summary = f"torchrun --nproc_per_node=1, {plan.ddp_steps} steps on {setup or '?'}: val loss {losses}"
    if wanted not in setup:
        summary += f"; expected {wanted!r}"
    return Result("ddp", "PASS" if passed else "FAIL", summary, figures)


def check_in_process(check: str, flag: str, rehearsal: bool, out: Path) -> Result:
    """Runs this script with `flag` (one check, in a process of its own under its time limit): its last line of
    output is the check's `Result` as JSON."""
    log = out / f"{check}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), flag, *(["--rehearse-on-cpu"] * rehearsal)]
    rc, stdout = run(cmd, LIMITS_S[check], log)
    if rc != 0:
        return failed_run(check, rc, LIMITS_S[check], log)
    lines = stdout.strip().splitlines()
    if not lines:
        return Result(check, "FAIL", f"the check printed nothing; see {log}", {})
    return Result(**json.loads(lines[-1]))


def onnx_parity(rehearsal: bool, decode_steps: int = 16) -> Result:
    """ONNX Runtime's CUDA provider (CPU in a rehearsal) against its CPU provider on the shipped fp32 graph."""
    import numpy as np
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels that a CUDA torch brings, if there are any
    cuda = ("CUDAExecutionProvider", {"use_tf32": "0"})  # TF32 would round fp32 matmuls to 10-bit mantissas
    if not rehearsal and cuda[0] not in ort.get_available_providers():
        reason = (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (it has {ort.get_available_providers()}): "
            f"pip install onnxruntime-gpu in place of onnxruntime"
        )
        return Result("onnx-cuda", "SKIP", reason, {})

    from gpt_serve.generation.backends.onnx_backend import OnnxBackend
    from gpt_serve.generation.inline import left_pad

    cpu = "CPUExecutionProvider"
    reference = OnnxBackend("shakespeare", providers=[cpu])
    target = OnnxBackend("shakespeare", providers=[cpu] if rehearsal else [cuda, cpu])
    providers = target.providers
    if not rehearsal and providers[0] != cuda[0]:
        return Result("onnx-cuda", "FAIL", f"the session fell back to {providers} (CUDA/cuDNN libraries missing?)", {})
    prompts = ["ROMEO:\nBut soft, what light through yonder window breaks?", "JULIET:\nO Romeo, Romeo!", "\n"]
    ids, mask = left_pad([reference.vocab.encode(p) for p in prompts])
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    new_ids, caches, diffs, same_argmax = ids, (None, None), [], 0
    for _ in range(decode_steps + 1):
        (want, ref_cache), (got, target_cache) = (
            backend.forward(new_ids, mask, positions, cache)
            for backend, cache in zip((reference, target), caches, strict=True)
        )
        caches = (ref_cache, target_cache)
        diffs.append(float(np.abs(got - want).max()))
        same_argmax += int((got.argmax(-1) == want.argmax(-1)).all())
        new_ids = want.argmax(-1)[:, None].astype(np.int64)  # (B, 1): both sides get the CPU provider's choice
        positions = positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones_like(new_ids)], axis=1)
    figures = {
        "providers": providers,
        "max_abs_logits_prefill": diffs[0],
        "max_abs_logits_decode": max(diffs[1:]),
        "steps_with_equal_argmax": f"{same_argmax}/{len(diffs)}",
    }
    passed = max(diffs) <= ONNX_ATOL
    against = "CPUExecutionProvider against itself (rehearsal)" if rehearsal else f"{providers[0]} vs CPU"
    summary = (
        f"{against}, shakespeare onnx/model.onnx, batch of {len(prompts)} left-padded: max |Δlogits| prefill "
        f"{diffs[0]:.1e}, {decode_steps} decode steps {max(diffs[1:]):.1e} (limit {ONNX_ATOL:g}); argmax equal "
        f"in {figures['steps_with_equal_argmax']} steps"
    )
    return Result("onnx-cuda", "PASS" if passed else "FAIL", summary, figures)


def serve_scaling(rehearsal: bool) -> Result:
    """One stream, then `SERVE_STREAMS` at once, through a `Scheduler` on the shipped model in PyTorch on the GPU
    (on CPU, shorter, in a rehearsal)."""
    import torch

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # `benchmarks` is a folder of scripts, importable from the repository root
    from benchmarks.serving import run as run_streams
    from benchmarks.serving import scheduler_stream
    from gpt_serve import CharGPTForCausalLM
    from gpt_serve.chargpt.vocab import CharVocab
    from gpt_serve.generation.backends.torch_backend import TorchBackend
    from gpt_serve.generation.scheduler import Scheduler
    from gpt_serve.models import model_path

    device = "cpu" if rehearsal else "cuda"
    tokens = 40 if rehearsal else SERVE_TOKENS
    folder = model_path("shakespeare")
    model = CharGPTForCausalLM.from_pretrained(folder).to(device).eval()
    scheduler = Scheduler(TorchBackend(model), max_batch=SERVE_STREAMS)
    try:
        prompt = CharVocab.from_file(folder / "vocab.json").encode("ROMEO:")
        consume = scheduler_stream(scheduler, prompt, tokens, "refill")
        run_streams(consume, SERVE_STREAMS, tokens)  # warm-up: CUDA's first calls, every window length
        one, many = run_streams(consume, 1, tokens), run_streams(consume, SERVE_STREAMS, tokens)
    finally:
        scheduler.close()
    ratio = many["aggregate"] / one["aggregate"]
    each = many["per_stream"] / one["per_stream"]
    complete = one["complete"] == 1 and many["complete"] == SERVE_STREAMS
    figures = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "tokens_per_stream": tokens,
        "one_stream_tok_s": round(one["aggregate"]),
        f"{SERVE_STREAMS}_streams_aggregate_tok_s": round(many["aggregate"]),
        "aggregate_ratio": round(ratio, 2),
        "per_stream_ratio": round(each, 2),
        f"{SERVE_STREAMS}_streams_ttft_p50_ms": round(many["ttft_p50"] * 1e3, 1),
    }
    passed = complete and (rehearsal or (ratio >= 8 and each >= 0.5))
    summary = (
        f"{'PyTorch on CPU (rehearsal)' if rehearsal else 'PyTorch on ' + figures['device']}, shakespeare, {tokens} "
        f"tokens a stream: one stream {one['aggregate']:,.0f} tok/s, {SERVE_STREAMS} at once {many['aggregate']:,.0f}"
        f" ({ratio:.1f}x; target 8x), each {each:.0%} of one alone (target 50%), first token p50 "
        f"{many['ttft_p50'] * 1e3:.0f} ms; {'all' if complete else 'not all'} complete"
    )
    return Result("serve-cuda", "PASS" if passed else "FAIL", summary, figures)


def environment(rehearsal: bool) -> tuple[dict, str | None]:
    """Versions and the GPU; the second item says why there is nothing to check on, if so."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "onnxruntime", "onnxruntime-gpu"):
        try:
            env[name] = version(name)
        except PackageNotFoundError:
            env[name] = None
    if env["transformers"] is None or tuple(int(x) for x in env["transformers"].split(".")[:2]) < (5, 24):
        return env, f"gpt-serve needs transformers>=5.24,<6, found {env['transformers']} (pip install -e '.[train]')"
    if rehearsal:
        return env, None
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return env, f"torch {torch.__version__} ({build}) sees no CUDA device: torch.cuda.is_available() is False"
    env["gpu"] = torch.cuda.get_device_name(0)
    env["gpus"] = torch.cuda.device_count()
    return env, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check", help="gpu_check.json and the logs")
    p.add_argument("--work", type=Path, default=None, help="the training runs (default: OUT)")
    p.add_argument("--data", type=Path, default=None, help=f"Tiny Shakespeare (default: {DEFAULT_DATA} if there)")
    p.add_argument("--steps", type=int, default=None, help=f"stage F steps (default {GPU.steps})")
    p.add_argument("--rehearse-on-cpu", action="store_true", help="the same checks on CPU, to test this script")
    p.add_argument("--onnx-parity", action="store_true", help=argparse.SUPPRESS)  # the onnx-cuda check's process
    p.add_argument("--serve-scaling", action="store_true", help=argparse.SUPPRESS)  # the serve-cuda check's process
    args = p.parse_args(argv)
    if args.onnx_parity:
        print(json.dumps(asdict(onnx_parity(args.rehearse_on_cpu))))
        return 0
    if args.serve_scaling:
        print(json.dumps(asdict(serve_scaling(args.rehearse_on_cpu))))
        return 0

    started = time.time()
    env, unavailable = environment(args.rehearse_on_cpu)
    if unavailable:
        print(f"gpu_check: nothing to check on: {unavailable}")
        return 2
    plan = CPU if args.rehearse_on_cpu else GPU
    out, work = args.out.resolve(), (args.work or args.out).resolve()  # the checks run with cwd=ROOT
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    data = args.data.resolve() if args.data else (DEFAULT_DATA if DEFAULT_DATA.is_file() else None)  # None: download
    results = []
    for check in (
        lambda: check_train(plan, args.steps or plan.steps, work, out, data),
        lambda: check_ddp(plan, work, out, data),
        lambda: check_in_process("onnx-cuda", "--onnx-parity", args.rehearse_on_cpu, out),
        lambda: check_in_process("serve-cuda", "--serve-scaling", args.rehearse_on_cpu, out),
    ):
        results.append(check())
        print(results[-1].line, flush=True)
    summary = {
        "rehearsal_on_cpu": args.rehearse_on_cpu,
        "environment": env,
        "seconds": round(time.time() - started, 1),
        "checks": [{**asdict(r), "line": r.line} for r in results],
    }
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
