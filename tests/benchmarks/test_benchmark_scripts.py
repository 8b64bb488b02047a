"""The benchmark scripts run end to end on tiny inputs (their numbers are not checked: benchmarks, not tests)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def assert_refused(name: str, args: list[str], message: str) -> None:
    """The script exits 2 (argparse's usage error) at once, `message` on stderr."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]


def test_decode_floor():
    out = run_script(
        "decode_floor.py",
        *("--threads", "1", "--n-embd", "32", "--n-layer", "1", "--n-head", "4", "--past", "8"),
        *("--repeats", "3", "--rows", "1", "3"),
    )
    for path in ("PyTorch F.linear", "PyTorch DecodeLinear", "ONNX Runtime MatMul only", "KV Concat, past 8"):
        assert out.count(path) == 2
    assert "batch 1:" in out and "batch 3:" in out


def test_decode_gap_prints_the_floor_and_each_backends_step_per_row_count(data_path):
    out = run_script(
        "decode_gap.py",
        *("--size", "shipped", "--rows", "1", "2", "--repeats", "2", "--rounds", "1", "--threads", "1"),
    )
    header = next(line for line in out.splitlines() if line.startswith("| rows |"))
    assert all(f"| {key} step, ms (x floor) |" in header for key in ("torch", "onnx", "onnx-int8"))
    for rows in (1, 2):
        row = next(line for line in out.splitlines() if line.startswith(f"| {rows} | "))
        assert row.count("x) |") == 3 and row.count(" / ") == 2, row  # three steps, the torch split
    assert "every row at 64 cached positions" in out and "read bandwidth" in out
    out = run_script(  # the lesson's size, torch alone (no export)
        "decode_gap.py",
        *("--size", "lesson", "--backends", "torch", "--rows", "1", "--past", "8", "--repeats", "2"),
        *("--rounds", "1", "--threads", "1", "--data", str(data_path)),
    )
    assert "n_embd 384, 6 heads, 6 layers, block 256; every row at 8 cached positions" in out
    assert sum(line.startswith("| 1 | ") for line in out.splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--size", "shipped", "--past", "127"], "--past 127 does not fit the shipped size's block of 128"),
        (["--rows", "4", "0"], "--rows must be >= 1, got 0"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    ],
)
def test_decode_gap_refuses_what_it_cannot_measure(args, message):
    assert_refused("decode_gap.py", args, message)


def test_prefix_share_prints_every_example_prompt_prefilled_and_cached():
    out = run_script(
        "prefix_share.py",
        *("--model", "ladder-a", "--backends", "torch", "onnx-int8", "--rows", "1", "2", "--tokens", "5"),
        *("--repeats", "2", "--rounds", "1", "--threads", "1"),
    )
    assert "requests of 5 new tokens" in out
    assert "| prefill, ms | cached, ms | request among 1 rows, ms (saved) | request among 2 rows, ms (saved) |" in out
    rows = [line for line in out.splitlines() if line.startswith(("| torch |", "| onnx-int8 |"))]
    assert len(rows) == 10 and all(row.count("%)") == 2 for row in rows)  # 5 examples x 2 backends


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rows", "0"], "--rows must be >= 1, got 0"),
        (["--tokens", "0"], "--tokens must be >= 1, got 0"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    ],
)
def test_prefix_share_refuses_what_it_cannot_measure(args, message):
    assert_refused("prefix_share.py", args, message)


def test_prefix_share_refuses_a_folder_without_example_prompts(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(ROOT / "gpt_serve" / "models" / "ladder-a", folder)
    (folder / "corpus.json").unlink()
    assert_refused("prefix_share.py", ["--model", str(folder)], "records no example prompts (corpus.json)")


def test_decode_attention_times_every_variant_and_the_paired_steps():
    out = run_script(
        "decode_attention.py",
        *("--size", "shipped", "--rows", "1", "9", "--threads", "1", "--repeats", "1", "--rounds", "1"),
    )
    header = next(line for line in out.splitlines() if line.startswith("| size |"))
    assert header.count(" | ") == 11  # size, rows, threads, eight variants, load
    for rows in (1, 9):
        row = next(line for line in out.splitlines() if line.startswith(f"| shipped | {rows} | 1 |"))
        assert row.count(" / ") == 8, row  # no mask / mask for each variant
    out = run_script(
        "decode_attention.py",
        *("--steps", "--size", "shipped", "--rows", "1", "3", "--threads", "1", "--repeats", "1", "--rounds", "2"),
    )
    assert sum(line.startswith("| shipped | ") for line in out.splitlines()) == 2, out


def test_decode_attention_refuses_what_it_cannot_measure():
    assert_refused("decode_attention.py", ["--rows", "4", "0"], "--rows must be >= 1, got 0")


@pytest.mark.slow
def test_training_benchmark(data_path, tmp_path):
    out = run_script(
        "training.py",
        *("--threads", "1", "--presets", "tiny", "--warmup", "1", "--steps", "1", "--rounds", "1"),
        *("--data", str(data_path), "--json", str(tmp_path / "r.json")),
    )
    assert "tiny" in out and "speedup" in out and (tmp_path / "r.json").is_file()


@pytest.mark.slow
def test_decode_benchmark(data_path):
    out = run_script(
        "onnx_generation.py",
        *("--models", "ladder-a", "--threads", "1", "--past-window-tokens", "4", "--data", str(data_path)),
    )
    assert out.count("| ladder-a |") == 4  # naive, PyTorch, ONNX Runtime fp32, int8


def test_int8_formats_benchmark():
    out = run_script("int8_formats.py", "--model", "ladder-a", "--threads", "1", "--tokens", "20", "--repeats", "1")
    assert out.count("| MatMulNBits 4-bit") == 1 and "| fp32 (reference) |" in out
    assert "| the export's int8 (`onnx-int8`: ONNX Runtime's int8 kernel) | " in out


def test_serving_benchmark():
    out = run_script(
        "serving.py",
        *("--model", "ladder-a", "--backends", "torch", "onnx", "--streams", "1", "3", "--tokens", "20"),
        *("--threads", "1", "--window-mode", "exact"),
    )
    assert "| torch | 3 | 3/3 |" in out and "| onnx | 1 | 1/1 |" in out
    for unshared in ([], ["--unshared"]):  # requests of 8 choices, the prompt forked (or each prefilled)
        out = run_script(
            "serving.py",
            *("--model", "ladder-a", "--backends", "torch", "onnx-int8", "--streams", "1", "2", "--tokens", "6"),
            *("--threads", "1", "--n", "8", *unshared),
        )
        assert "each stream a request of n=8 choices" in out
        assert "| torch | 2 | 2/2 |" in out and "| onnx-int8 | 1 | 1/1 |" in out
    out = run_script(
        "serving.py",
        *("--model", "ladder-a", "--backends", "torch", "--streams", "2", "--tokens", "10", "--threads", "1"),
        *("--over", "api"),
    )
    assert "| torch | 2 | 2/2 |" in out
    out = run_script(
        "serving.py",
        *("--model", "ladder-a", "--backends", "torch", "--streams", "2", "--tokens", "5", "--threads", "1"),
        *("--over", "api", "--n", "8"),
    )
    assert "| torch | 2 | 2/2 |" in out
    out = run_script(
        "serving.py",
        *("--model", "ladder-a", "--backends", "onnx-int8", "--streams", "2", "--tokens", "10", "--threads", "1"),
        *("--over", "demo"),
    )
    assert "| onnx-int8 | 2 | 2/2 |" in out
    out = run_script(
        "serving.py",
        *("--model", "ladder-a", "--backends", "onnx", "--streams", "2", "--tokens", "10", "--threads", "1"),
        *("--over", "demo", "--client", "gradio_client", "--max-updates-per-second", "0"),
    )
    assert "| onnx | 2 | 2/2 |" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--client", "gradio_client"], "only with --over demo: --client gradio_client"),
        (["--over", "api", "--new-sessions"], "only with --over demo: --new-sessions"),
        (["--max-updates-per-second", "50"], "only with --over demo: --max-updates-per-second"),
        (["--over", "demo", "--client", "gradio_client", "--new-sessions"], "--new-sessions is for the http client"),
        (["--over", "demo", "--max-updates-per-second", "-1"], "must be a finite number >= 0, got -1"),
        (["--n", "0"], "--n must be at least 1, got 0"),
        (["--over", "demo", "--n", "8"], "--n is for --over scheduler or api"),
        (["--over", "api", "--unshared"], "--unshared is for --over scheduler"),
    ],
)
def test_serving_benchmark_refuses_flags_that_would_do_nothing(args, message):
    assert_refused("serving.py", args, message)


def test_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_2(tmp_path):
    """`gpu_check.sh` stops at once where nvidia-smi is missing, `gpu_check.py` where torch sees no CUDA device."""
    script = ROOT / "benchmarks" / "gpu_check"
    answers = []
    if shutil.which("nvidia-smi") is None:
        answers.append((["bash", f"{script}.sh", str(tmp_path)], "no GPU (nvidia-smi is not on PATH)"))
    if not torch.cuda.is_available():
        answers.append(([sys.executable, f"{script}.py", "--out", str(tmp_path)], "torch.cuda.is_available() is False"))
    if not answers:
        pytest.skip("this machine has a GPU")
    for cmd, reason in answers:
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, result.stderr[-2000:]
        lines = (result.stdout + result.stderr).splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpu_check: nothing to check on: ") and reason in lines[0]
    assert not (tmp_path / "gpu_check.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the SKIP of a machine without onnxruntime-gpu")
def test_gpu_check_skips_onnx_cuda_without_the_cuda_provider():
    result = json.loads(run_script("gpu_check.py", "--onnx-parity").strip())
    assert result["status"] == "SKIP" and "pip install onnxruntime-gpu" in result["summary"]


@pytest.mark.distributed  # ~20 s: two tiny training runs, one under torchrun
def test_gpu_check_rehearses_its_checks_on_cpu(tmp_path):
    """The script's own logic (commands, limits, log parsing, judging, the summary), on CPU: its GPU run is rare."""
    out = run_script("gpu_check.py", "--rehearse-on-cpu", "--out", str(tmp_path / "out"), "--work", str(tmp_path))
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["PASS train", "PASS ddp", "PASS onnx-cuda", "PASS serve-cuda"]
    assert "cpu, fp32, DDP over gloo, 1 process" in lines[1]
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [c["line"] for c in summary["checks"]] == lines and summary["rehearsal_on_cpu"]
    assert "PyTorch on CPU (rehearsal), shakespeare, 40 tokens a stream: one stream" in lines[3]
    assert {"train.log", "ddp.log", "onnx-cuda.log", "serve-cuda.log"} <= {p.name for p in (tmp_path / "out").iterdir()}
    assert (tmp_path / "train" / "model.safetensors").is_file()  # the runs go to --work, not --out


def test_gpu_check_onnx_limit_is_the_exports():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from export.validate import FP32_LOGITS_ATOL

    assert gpu_check.ONNX_ATOL == FP32_LOGITS_ATOL


def test_decode_threads_benchmark():
    out = run_script(
        "decode_threads.py",
        *("--model", "ladder-a", "--threads", "1", "--rows", "1", "2", "--steps", "2", "--repeats", "1"),
        *("--rounds", "1"),
    )
    assert all(f"| {layout} | " in out for layout in ("main", "second-thread", "runner"))


def test_decode_batch_benchmark():
    out = run_script(
        "decode_batch.py",
        *("--model", "ladder-a", "--threads", "1", "--rows", "1", "3", "--steps", "3", "--repeats", "1"),
        *("--cached", "4"),
    )
    for batch in ("TorchDecodeBatch", "OnnxDecodeBatch", "OnnxInPlaceBatch"):
        assert out.count(f"| {batch} |") == (2 if batch == "TorchDecodeBatch" else 4)  # 2 row counts (x 2 ONNX files)


@pytest.mark.parametrize("graph", ["inplace", "hf"])
def test_scheduler_process_benchmark(graph):
    out = run_script(
        "scheduler_process.py", "--model", "ladder-a", "--graph", graph, "--streams", "2", "--tokens", "20"
    )
    assert out.strip() == "40 tokens"


def test_the_lm_eval_check_builds_a_task_of_true_and_false_continuations(corpus, tmp_path):
    """lm-eval itself is not installed here (docs/benchmarks.md runs it); the task it is given is checked."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lm_eval_check", ROOT / "benchmarks" / "lm_eval_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    items = module.questions(corpus, 50)
    val = corpus[int(0.9 * len(corpus)) :]
    assert len(items) == 50
    for q in items:
        assert len(q["context"]) == 64 and len(q["choices"]) == 4 and all(len(c) == 16 for c in q["choices"])
        assert q["context"] + q["choices"][q["label"]] in val
    folder = module.write_task(tmp_path, items)
    assert "output_type: multiple_choice" in (folder / f"{module.TASK}.yaml").read_text()
    assert len((folder / "questions.jsonl").read_text().splitlines()) == 50


def test_finite_weights_benchmark():
    out = run_script("finite_weights.py", "--repeats", "1", "--n-embd", "32")
    assert "custom:" in out and "check_finite_weights" in out


@pytest.mark.slow
def test_peers_benchmark_runs_our_engines_and_transformers_continuous_batching():
    out = run_script(
        "peers.py",
        *("--model", "ladder-a", "--engines", "torch", "onnx-int8", "hf-cb", "hf-cb-gpt2", "--streams", "2"),
        *("--tokens", "2", "--rounds", "1", "--threads", "1"),
    )
    for engine in ("torch", "onnx-int8", "hf-cb", "hf-cb-gpt2"):
        row = next((line for line in out.splitlines() if line.startswith(f"| {engine} | 2 | ")), None)
        assert row is not None and "failed" not in row, out
        assert row.rstrip().endswith("| 4 |"), row  # tokens a round: 2 streams of 2 tokens


@pytest.mark.vllm
@pytest.mark.slow
def test_peers_benchmark_runs_vllm():
    from vllm_venv import python_or_skip

    python_or_skip()
    out = run_script(
        "peers.py",
        *("--model", "ladder-a", "--engines", "vllm-eager", "--streams", "2", "--tokens", "2", "--rounds", "1"),
        *("--threads", "1"),
    )
    assert "| vllm-eager | 2 | " in out and "failed" not in out and "| 4 |" in out, out


def test_structured_benchmark():
    out = run_script(
        "structured.py",
        *("--threads", "1", "--backends", "onnx", "--streams", "3", "--tokens", "8", "--rounds", "1"),
        *("--compiles", "2"),
    )
    assert "onnx       3 streams x 8 tokens" in out and "ratio" in out
    assert "compile, small JSON schema" in out and "compile, speaker-line regex" in out
    assert "grammar" in out and "compile, json_object" in out


@pytest.mark.slow
def test_finetune_benchmark(data_path, tmp_path):
    text = tmp_path / "own.txt"  # any text: the script's plumbing, not its figures
    text.write_text(data_path.read_text()[:60_000])
    out = run_script(
        "finetune.py", *("--data", str(text), "--threads", "1", "--max-iters", "4", "--out", str(tmp_path / "runs"))
    )
    assert out.count("| 4 |") == 2 and out.count("| 8 |") == 1  # tuned and scratch at 4 steps, the longer at 8
