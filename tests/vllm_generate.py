"""Greedy generation with vLLM's offline engine (`vllm.LLM`) over several model folders in one process: run by
vLLM's venv's Python (`tests/vllm_venv.py`), it imports nothing of gpt-serve.

    .venv-vllm/bin/python tests/vllm_generate.py OUT.json TOKENS FOLDER... < prompts.json

For each folder (a `gpt-serve copy` or a saved model: its own code, `trust_remote_code`) in turn: the engine with
`max_model_len` = the folder's `block_size` and fp32, then every prompt (a list of token ids, from stdin as JSON) for
`min(TOKENS, block_size - len(prompt))` new tokens at temperature 0, with the logprob of each. OUT.json gets one entry
per folder: `{"tokens": [[...] per prompt], "logprobs": [[...]], "load_s": ...}` or `{"error": "..."}`. An engine
that failed leaves vLLM's state unusable for the next one in this process, so the folders after it are not run
(`{"error": "not run: ..."}`): put a folder expected to fail last.
"""

import json
import sys
import time


def generate(folder: str, prompts: list[list[int]], tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    with open(f"{folder}/config.json", encoding="utf-8") as f:
        block_size = json.load(f)["block_size"]
    start = time.perf_counter()
    llm = LLM(
        model=folder,
        trust_remote_code=True,
        model_impl="transformers",
        dtype="float32",
        max_model_len=block_size,
        enforce_eager=True,
        distributed_executor_backend="uni",
        seed=0,
    )
    load_s = time.perf_counter() - start
    requests = [{"prompt_token_ids": prompt} for prompt in prompts]
    sampling = [
        SamplingParams(temperature=0, max_tokens=min(tokens, block_size - len(p)), logprobs=0, ignore_eos=True)
        for p in prompts
    ]
    outputs = llm.generate(requests, sampling, use_tqdm=False)
    result = {"tokens": [], "logprobs": [], "load_s": round(load_s, 1)}
    for output in outputs:
        completion = output.outputs[0]
        result["tokens"].append(list(completion.token_ids))
        result["logprobs"].append([step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs)])
    llm.llm_engine.engine_core.shutdown()
    return result


def main() -> int:
    out, tokens, folders = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    prompts = json.load(sys.stdin)
    results, failed = {}, None
    for folder in folders:
        if failed is not None:
            results[folder] = {"error": f"not run: {failed} failed before it"}
            continue
        try:
            results[folder] = generate(folder, prompts, tokens)
        except Exception as e:  # noqa: BLE001 (the test reads what vLLM said)
            results[folder] = {"error": f"{type(e).__name__}: {e}"}
            failed = folder
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":  # vLLM may start worker processes with spawn, which imports this file again
    raise SystemExit(main())
