"""OnnxBackend: the same tokens as the PyTorch backend through the shared engine, and clear errors."""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from lesson_reference import full_recompute_generate

from gpt_serve.generation.backends.onnx_backend import OnnxBackend
from gpt_serve.generation.backends.onnx_session import UnsupportedGraph, run_inplace
from gpt_serve.generation.backends.torch_backend import TorchBackend
from gpt_serve.generation.inline import generate_tokens, stream_text
from gpt_serve.generation.model_folder import record_vocab_sha256
from gpt_serve.generation.sampling import SamplingParams
from gpt_serve.models import DEFAULT_MODEL, list_models, model_path
from gpt_serve.onnx_contract import onnx_path
from tests.conftest import make_tiny_model

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def onnx_backend(exported_dir):
    return OnnxBackend(exported_dir, threads=1)


@pytest.fixture(scope="module")
def torch_backend():
    return TorchBackend(make_tiny_model())  # the weights saved in tiny_model_dir


def tokens(backend, prompts, n, sampling=GREEDY, **kwargs) -> np.ndarray:
    return np.stack(list(generate_tokens(backend, prompts, n, sampling, **kwargs)), axis=1)  # (B, n)


def test_backend_attributes(onnx_backend):
    assert (onnx_backend.block_size, onnx_backend.vocab_size) == (16, 65)
    assert len(onnx_backend.vocab) == 65 and onnx_backend.vocab.decode([0]) == "\n"
    assert onnx_backend.session.get_session_options().intra_op_num_threads == 1
    assert onnx_backend.providers == ["CPUExecutionProvider"]


@pytest.mark.parametrize("window_mode", ["exact", "refill"])
def test_greedy_200_tokens_across_the_window_match_pytorch(onnx_backend, torch_backend, window_mode):
    prompt = [[18, 47, 56, 57, 58]]  # "First"
    ours = tokens(onnx_backend, prompt, 200, window_mode=window_mode)
    theirs = tokens(torch_backend, prompt, 200, window_mode=window_mode)
    np.testing.assert_array_equal(ours, theirs)
    reference = full_recompute_generate(make_tiny_model(), prompt[0], 200, GREEDY, window_mode=window_mode)
    np.testing.assert_array_equal(ours[0], reference)
    assert len(set(ours[0].tolist())) > 3  # not a degenerate stream that would match by accident


@pytest.mark.parametrize("window_mode", ["exact", "refill"])
def test_greedy_left_padded_batch_matches_pytorch(onnx_backend, torch_backend, window_mode):
    prompts = [list(range(1, 12)), [5, 6, 7], [42]]
    refill = 5 if window_mode == "refill" else None
    ours = tokens(onnx_backend, prompts, 200, window_mode=window_mode, refill_tokens=refill)
    theirs = tokens(torch_backend, prompts, 200, window_mode=window_mode, refill_tokens=refill)
    np.testing.assert_array_equal(ours, theirs)
    # Nothing leaks between rows: each row alone gives the tokens it gets beside the others, in both window modes
    # (a row's window is its own tokens only)
    for b, prompt in enumerate(prompts):
        alone = tokens(onnx_backend, [prompt], 200, window_mode=window_mode, refill_tokens=refill)[0]
        np.testing.assert_array_equal(alone, ours[b])


def test_sampled_tokens_with_the_same_seed_match_pytorch(onnx_backend, torch_backend):
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.9)
    prompts = [[1, 2, 3], [7]]
    ours = tokens(onnx_backend, prompts, 60, sampling, seed=1234)
    np.testing.assert_array_equal(ours, tokens(torch_backend, prompts, 60, sampling, seed=1234))
    np.testing.assert_array_equal(ours, tokens(onnx_backend, prompts, 60, sampling, seed=1234))
    assert not np.array_equal(ours, tokens(onnx_backend, prompts, 60, sampling, seed=4321))


def test_stream_text_matches_pytorch(onnx_backend, torch_backend):
    kwargs = dict(seed=7, window_mode="refill")
    ours = list(stream_text(onnx_backend, onnx_backend.vocab, "ROMEO:", 40, SamplingParams(0.8), **kwargs))
    theirs = list(stream_text(torch_backend, onnx_backend.vocab, "ROMEO:", 40, SamplingParams(0.8), **kwargs))
    assert ours == theirs and len(ours) == 40 and all(len(piece) == 1 for piece in ours)


def test_forward_logits_and_cache_match_pytorch(onnx_backend, torch_backend):
    ids = np.array([[0, 0, 20, 21], [30, 31, 32, 33]], dtype=np.int64)
    mask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]], dtype=np.int64)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ours, cache = onnx_backend.forward(ids, mask, positions, None)
    theirs, torch_cache = torch_backend.forward(ids, mask, positions, None)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    assert ours.dtype == np.float32 and ours.shape == (2, 65)
    step = np.array([[3], [4]], dtype=np.int64)
    mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
    ours, cache = onnx_backend.forward(step, mask, positions[:, -1:] + 1, cache)
    theirs, _ = torch_backend.forward(step, mask, positions[:, -1:] + 1, torch_cache)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    assert cache.length == 5 and cache.batch_size == 2


def test_one_backend_serves_concurrent_generations(onnx_backend):
    prompts = [[[1, 2, 3]], [[40, 41]], [[7]], [[20, 30, 40, 50]]]
    expected = [tokens(onnx_backend, p, 50, window_mode="refill") for p in prompts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: tokens(onnx_backend, p, 50, window_mode="refill"), prompts * 3))
    for got, want in zip(results, expected * 3, strict=True):
        np.testing.assert_array_equal(got, want)


def test_int8_backend_runs_and_stays_close_to_fp32(exported_dir, onnx_backend):
    int8 = OnnxBackend(exported_dir, quantized=True, threads=1)
    assert int8.quantized and int8.metadata["weights"] == "int8" and int8.path.name == "model_quantized.onnx"
    ids = np.array([[18, 47, 56, 57, 58]], dtype=np.int64)
    positions = np.arange(5, dtype=np.int64)[None]
    mask = np.ones_like(ids)
    q, _ = int8.forward(ids, mask, positions, None)
    f, _ = onnx_backend.forward(ids, mask, positions, None)
    np.testing.assert_allclose(q, f, atol=0.05, rtol=0)
    assert not np.array_equal(q, f)  # it is really the quantized graph
    assert tokens(int8, [[1, 2]], 40, window_mode="refill").shape == (1, 40)


@pytest.mark.parametrize("quantized", [False, True])
def test_the_inplace_batch_gives_the_hugging_face_layout_batchs_tokens(exported_dir, quantized):
    """The two graphs decode the same rows to the same greedy tokens (fp32 arithmetic: int8 weights folded), rows
    joining and leaving mid-flight; the in-place batch is what `new_batch` gives when the folder has its graph."""
    both = [OnnxBackend(exported_dir, quantized, threads=1, int8_compute=False, inplace=i) for i in (True, False)]
    batches = [b.new_batch(4) for b in both]
    assert [type(b).__name__ for b in batches] == ["OnnxInPlaceBatch", "OnnxDecodeBatch"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 65, n).tolist() for n in (5, 1, 6, 3)]  # each stays inside the 16-token window
    runs = []
    for batch in batches:
        tokens, out = [], []
        for step in range(10):
            if step < len(prompts):  # one row joins per step
                tokens.append(int(batch.add(prompts[step]).argmax()))
            if step == 6:
                batch.remove(1)  # a row leaves: the last one takes its place
                tokens[1] = tokens.pop()
            logits = batch.step(np.array(tokens))
            tokens = [int(t) for t in logits.argmax(-1)]
            out.append(tokens)
        runs.append(out)
    assert runs[0] == runs[1]


def test_the_engine_decodes_one_prompt_on_the_inplace_graph_and_batches_on_the_other(exported_dir):
    """One prompt runs on the backend's one-row batch (the scheduler's arithmetic), so the in-place graph; both give
    the same greedy tokens across the window, and a left-padded batch still runs the Hugging Face layout graph."""
    inplace, hf = (OnnxBackend(exported_dir, threads=1, inplace=i) for i in (True, False))
    assert inplace.inplace_session is not None and hf.inplace_session is None
    for mode in ("exact", "refill"):
        assert (
            tokens(inplace, [[1, 2, 3]], 40, window_mode=mode).tolist()
            == tokens(hf, [[1, 2, 3]], 40, window_mode=mode).tolist()
        )
    np.testing.assert_array_equal(tokens(inplace, [[1, 2], [3]], 20), tokens(hf, [[1, 2], [3]], 20))


def test_full_windows_run_on_the_inplace_graph_with_the_forwards_logits(exported_dir, torch_backend):
    """`window_logits` (exact mode past the window) on the in-place graph: PyTorch's numbers, and one session."""
    backend = OnnxBackend(exported_dir, threads=1)
    ids = np.random.default_rng(1).integers(0, 65, (3, backend.block_size))
    runs = []
    backend.session.run_with_iobinding = lambda *a: runs.append(1)  # the Hugging Face layout graph must stay idle
    np.testing.assert_allclose(backend.window_logits(ids), torch_backend.window_logits(ids), atol=1e-4, rtol=0)
    assert not runs
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.window_logits(ids + 100)


# --- errors -------------------------------------------------------------------------------------------------------


def test_a_folder_without_the_inplace_graph_decodes_on_the_other(tmp_path, exported_dir):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    onnx_path(folder, inplace=True).unlink()  # exported before the in-place graph existed
    backend = OnnxBackend(folder, threads=1)
    assert backend.inplace_session is None and type(backend.new_batch(2)).__name__ == "OnnxDecodeBatch"
    assert tokens(backend, [[1, 2]], 5).shape == (1, 5)


def _unknown_attention_op(path: Path) -> None:
    """`path`'s GroupQueryAttention renamed to an op no ONNX Runtime has: what an older release sees."""
    proto = onnx.load(str(path))
    for node in proto.graph.node:
        if node.op_type == "GroupQueryAttention":
            node.op_type = "GroupQueryAttentionFromTheFuture"
    onnx.save(proto, str(path))


def test_an_onnx_runtime_without_the_inplace_kernel_falls_back_with_a_warning(tmp_path, exported_dir, caplog):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    _unknown_attention_op(onnx_path(folder, inplace=True))
    with caplog.at_level("WARNING"):
        backend = OnnxBackend(folder, threads=1)
    assert backend.inplace_session is None and type(backend.new_batch(2)).__name__ == "OnnxDecodeBatch"
    assert "cannot run" in caplog.text and "Upgrade onnxruntime" in caplog.text and "Hugging Face layout" in caplog.text
    shutil.copy(onnx_path(folder, inplace=True), onnx_path(folder))  # the same op in the main graph: refused
    with pytest.raises(UnsupportedGraph, match=r"onnxruntime \S+ cannot run .*model\.onnx.*Upgrade onnxruntime"):
        OnnxBackend(folder, inplace=False)


def test_the_inplace_batch_refuses_what_it_cannot_run(exported_dir):
    backend = OnnxBackend(exported_dir, threads=1)
    batch = backend.new_batch(2)
    batch.add([1, 2, 3])
    with pytest.raises(ValueError, match="one token per row: 1 rows, got 2 tokens"):
        batch.step(np.array([1, 2]))
    with pytest.raises(ValueError, match=r"ids \[65\] outside the vocabulary \[0, 64\]"):
        batch.step(np.array([65]))
    with pytest.raises(ValueError, match="1 to block_size = 16 tokens, got 17"):
        batch.add([1] * 17)
    strided = [b[:1, :, ::2] for b in batch.cache]  # not contiguous: ONNX Runtime would write into a copy
    with pytest.raises(ValueError, match="C-contiguous float32 cache buffers"):
        run_inplace(backend.inplace_session, np.ones((1, 1), dtype=np.int64), np.zeros(1, dtype=np.int64), strided)
    assert batch.step(np.array([4])).shape == (1, 65)  # still usable


@pytest.mark.parametrize("damage", ["truncated", "other export", "main graph"])
def test_a_bad_inplace_graph_is_refused_by_name(tmp_path, exported_dir, damage):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    path = onnx_path(folder, inplace=True)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
        match = "truncated or corrupt"
    elif damage == "other export":  # a stale file beside a fresh export
        proto = onnx.load(str(path))
        for p in proto.metadata_props:
            if p.key == "weights_sha256":
                p.value = "0" * 64
        onnx.save(proto, str(path))
        match = r"decoder_inplace\.onnx and .*model\.onnx come from different exports .*weights_sha256"
    else:  # the Hugging Face layout graph copied under the in-place name
        shutil.copy(onnx_path(folder), path)
        match = "has ONNX format 'chargpt-decoder-with-past'.*reads 'chargpt-decoder-inplace'"
    with pytest.raises(ValueError, match=match):
        OnnxBackend(folder)
    OnnxBackend(folder, threads=1, inplace=False)  # the other graph alone still loads


def test_missing_onnx_file_says_how_to_export(tiny_model_dir):
    with pytest.raises(FileNotFoundError, match=r"onnx/model\.onnx.*python -m export"):
        OnnxBackend(tiny_model_dir)


def test_missing_int8_file(tmp_path, exported_dir):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    onnx_path(folder, quantized=True).unlink()
    OnnxBackend(folder, threads=1)  # fp32 still loads
    with pytest.raises(FileNotFoundError, match="model_quantized.onnx"):
        OnnxBackend(folder, quantized=True)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_truncated_or_corrupt_onnx_file(tmp_path, exported_dir, damage):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    path = onnx_path(folder)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not an onnx model\x00\xff" * 100)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        OnnxBackend(folder)


def test_mismatched_vocabulary_is_refused(tmp_path, exported_dir):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    mapping = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    a, b = "a", "b"
    mapping[a], mapping[b] = mapping[b], mapping[a]  # same size, two ids swapped: text would decode wrongly
    (folder / "vocab.json").write_text(json.dumps(mapping), encoding="utf-8")
    with pytest.raises(ValueError, match="vocab.json is not the vocabulary the model was trained with"):
        OnnxBackend(folder)  # the folder's own check (`ModelFolder.open`), as every backend's
    (folder / "tokenizer.json").unlink()
    record_vocab_sha256(folder)  # the folder now agrees with itself; its export still has the old vocabulary
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        OnnxBackend(folder)
    del mapping["z"]
    mapping = {c: i for i, c in enumerate(sorted(mapping, key=mapping.get))}
    (folder / "vocab.json").write_text(json.dumps(mapping), encoding="utf-8")
    with pytest.raises(ValueError, match="64 characters"):
        OnnxBackend(folder)


def test_stale_export_is_refused(tmp_path, exported_dir):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["block_size"] = 32
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match="block_size: config.json 32, ONNX 16"):
        OnnxBackend(folder)


def test_unreadable_config_is_named(tmp_path, exported_dir):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=f"cannot read {re.escape(str(folder / 'config.json'))}: Expecting"):
        OnnxBackend(folder)


def test_export_of_other_weights_is_refused(tmp_path, exported_dir):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    make_tiny_model(seed=5).save_pretrained(folder)  # retrained after the export: same config, new weights
    with pytest.raises(ValueError, match="exported from other weights"):
        OnnxBackend(folder)
    (folder / "model.safetensors").unlink()  # a folder shipped with its ONNX files only still loads
    OnnxBackend(folder, threads=1)


def test_onnx_file_without_metadata_is_refused(tmp_path, exported_dir):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "m"))
    proto = onnx.load(str(onnx_path(folder)))
    del proto.metadata_props[:]
    onnx.save(proto, str(onnx_path(folder)))
    with pytest.raises(ValueError, match="lacks the metadata"):
        OnnxBackend(folder)


def test_bad_constructor_arguments(exported_dir, tmp_path):
    with pytest.raises(ValueError, match="threads"):
        OnnxBackend(exported_dir, threads=0)
    with pytest.raises(ValueError, match="the model folder '.*nowhere' does not exist"):
        OnnxBackend(tmp_path / "nowhere")


def test_wrong_typed_inputs(onnx_backend, torch_backend):
    ids = np.array([[1, 2, 3]], dtype=np.int64)
    mask, positions = np.ones_like(ids), np.arange(3, dtype=np.int64)[None]
    f = onnx_backend.forward
    with pytest.raises(TypeError, match="input_ids must hold integers"):
        f(ids.astype(np.float32), mask, positions, None)
    with pytest.raises(TypeError, match="attention_mask must be a numpy array"):
        f(ids, [[1, 1, 1]], positions, None)
    with pytest.raises(TypeError, match="position_ids must hold integers"):
        f(ids, mask, positions.astype(bool), None)
    with pytest.raises(ValueError, match="2-D"):
        f(ids[0], mask, positions, None)
    with pytest.raises(ValueError, match=r"attention_mask must have shape .*\(1, 3\)"):
        f(ids, mask[:, :2], positions, None)
    with pytest.raises(ValueError, match="position_ids must have the shape"):
        f(ids, mask, positions[:, :2], None)
    with pytest.raises(ValueError, match=r"ids \[65\] outside the vocabulary"):
        f(np.array([[1, 65, 3]]), mask, positions, None)
    with pytest.raises(ValueError, match=r"ids \[-1\] outside"):
        f(np.array([[1, -1, 3]]), mask, positions, None)
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, block_size\)"):
        f(ids, mask, positions + 14, None)
    with pytest.raises(TypeError, match="cache must be None or the OnnxCache"):
        f(ids, mask, positions, ("not", "a", "cache"))
    _, torch_cache = torch_backend.forward(ids, mask, positions, None)
    with pytest.raises(TypeError, match="KVBuffer"):
        f(ids[:, :1], np.ones((1, 4), dtype=np.int64), positions[:, :1], torch_cache)
    logits, cache = f(ids.astype(np.int32), mask, positions, None)  # any integer dtype is accepted
    with pytest.raises(ValueError, match="batch of 1 rows"):
        f(np.ones((2, 1), dtype=np.int64), np.ones((2, 4), dtype=np.int64), np.full((2, 1), 3), cache)
    # a padding position may hold an id the model never embeds (the tokenizer's pad id), as in PyTorch
    pad_ids = np.array([[65, 2, 3]])
    pad_mask = np.array([[0, 1, 1]])
    ours, _ = f(pad_ids, pad_mask, np.array([[0, 0, 1]]), None)
    theirs, _ = torch_backend.forward(pad_ids, pad_mask, np.array([[0, 0, 1]]), None)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


SHIPPED_WITH_ONNX = [name for name in list_models() if onnx_path(model_path(name)).is_file()]


@pytest.mark.skipif(DEFAULT_MODEL not in list_models(), reason="the default model is not in gpt_serve/models yet")
def test_the_default_shipped_model_ships_its_onnx_exports():
    for quantized in (False, True):
        assert onnx_path(model_path(DEFAULT_MODEL), quantized).is_file(), f"run `python -m export {DEFAULT_MODEL}`"


@pytest.mark.parametrize("name", SHIPPED_WITH_ONNX)
def test_shipped_onnx_exports_load_by_name_and_match_their_torch_model(name):
    from gpt_serve import CharGPTForCausalLM

    model = CharGPTForCausalLM.from_pretrained(model_path(name))
    for quantized in (False, True):
        backend = OnnxBackend(name, quantized=quantized, threads=1)  # also checks vocab, config and weights hash
        assert backend.model_dir == model_path(name) and backend.block_size == model.config.block_size
        ids = backend.vocab.encode("ROMEO:")
        ours = tokens(backend, [ids], 2 * backend.block_size + 3, window_mode="refill")[0]
        if not quantized:
            reference = full_recompute_generate(model, ids, len(ours), GREEDY, window_mode="refill")
            np.testing.assert_array_equal(ours, reference)
