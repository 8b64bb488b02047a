"""Scores a model served by `gpt-serve serve` with lm-evaluation-harness, through the OpenAI API (no hub, no network).

    python benchmarks/lm_eval_check.py --lm-eval /path/to/venv/bin/lm_eval        # shipped model, 200 questions
    python benchmarks/lm_eval_check.py --lm-eval lm_eval --model ladder-e --backend torch --limit 100

lm-eval's `local-completions` model scores loglikelihoods through `echo` + `logprobs` on `/v1/completions` (token-id
prompts, the tokenizer read from the folder's `tokenizer.json` as a plain `PreTrainedTokenizerFast`). The task is
built here from the validation split of Tiny Shakespeare (the last 10%, which no shipped model trained on): each
question is 64 characters of a play and four continuations of 16 characters, the true one and three from elsewhere
in the split; `acc` is how often the model gives the true one the highest log-likelihood (chance: 0.25). lm-eval
is heavy (it pulls torch, datasets, ...): install it in a venv of its own, `pip install -c constraints.txt
'lm-eval[api]'`. Prints lm-eval's table and the command it ran. Not a test: a documented check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
TASK = "shakespeare_next_line"


def questions(text: str, n: int, seed: int = 0) -> list[dict]:
    val = text[int(0.9 * len(text)) :]
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        i = rng.randrange(0, len(val) - 200)
        context, true = val[i : i + 64], val[i + 64 : i + 80]
        others = [val[j : j + 16] for j in rng.sample(range(0, len(val) - 16), 3)]
        if true in others:
            continue
        choices = [true, *others]
        rng.shuffle(choices)
        out.append({"context": context, "choices": choices, "label": choices.index(true)})
    return out


def write_task(folder: Path, items: list[dict]) -> Path:
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in items), encoding="utf-8")
    yaml = f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
target_delimiter: ""
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
    (folder / f"{TASK}.yaml").write_text(yaml, encoding="utf-8")
    return folder


def tokenizer_folder(model_folder: Path, out: Path) -> Path:
    """The folder's `tokenizer.json` with a config that names `PreTrainedTokenizerFast`: lm-eval loads it with
    transformers' AutoTokenizer and no code of ours."""
    out.mkdir(parents=True)
    shutil.copy(model_folder / "tokenizer.json", out / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1_000_000}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lm-eval", default="lm_eval", help="the lm_eval command (of the venv it is installed in)")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--backend", default="onnx-int8")
    p.add_argument("--limit", type=int, default=200, help="questions")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from gpt_serve.models import model_path

    folder = model_path(args.model)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        (work / "tasks").mkdir()
        write_task(work / "tasks", questions(args.data.read_text(encoding="utf-8"), args.limit))
        tokenizer = tokenizer_folder(folder, work / "tokenizer")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "gpt_serve", "serve", args.model, "--port", str(port), "--backend", args.backend,
             "--threads", str(args.threads), "--log-level", "warning"],
            cwd=ROOT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.5)
            model_args = ",".join(
                [
                    f"model={args.model}",
                    f"base_url=http://127.0.0.1:{port}/v1/completions",
                    "tokenizer_backend=huggingface",
                    f"tokenizer={tokenizer}",
                    "custom_prefix_token_id=0",  # no EOS token: score from a newline, as generation starts
                    "num_concurrent=4",
                    "max_retries=1",
                ]
            )
            command = [args.lm_eval, "--model", "local-completions", "--model_args", model_args,
                       "--tasks", TASK, "--include_path", str(work / "tasks"), "--batch_size", "1"]  # fmt: skip
            print("$", " ".join(command), flush=True)
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            return subprocess.run(command, env=env, cwd=work).returncode
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
