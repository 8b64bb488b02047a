"""The training loop on tiny configs: it learns, saves a loadable folder, and its options do what they say."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from gpt_serve.generation.backends.threads import available_cpus
from training.report import read_metrics, time_left
from training.trainer import TrainConfig, Trainer, make_scheduler


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_config):
    """A few dozen steps of the tiny preset, run once for the tests that inspect its output."""
    out = tmp_path_factory.mktemp("run")
    trainer = Trainer(make_config(out, max_iters=40, eval_interval=20), command="pytest run")
    return trainer, trainer.fit(), out


def test_a_few_dozen_steps_lower_the_loss(trained):
    _, result, out = trained
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [0, 20, 40]
    assert metrics[0]["val_loss"] > 4.0  # ~ln(vocab) at the start
    assert result["val_loss"] == metrics[-1]["val_loss"] < metrics[0]["val_loss"] - 0.7
    assert result["train_loss"] < metrics[0]["train_loss"] - 0.7
    assert all(m["tokens"] == m["step"] * 8 * 16 for m in metrics)


def test_the_output_folder_loads_with_the_auto_classes(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer, _, out = trained
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.vocab.chars == trainer.tokenizer.vocab.chars
    ids = tokenizer("ROMEO:", return_tensors="pt").input_ids
    with torch.no_grad():
        want = trainer.model.eval()(input_ids=ids, use_cache=False).logits
        torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, want, rtol=0, atol=0)
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "vocab.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "modeling_chargpt.py",
        "configuration_chargpt.py",
    ):
        assert (out / name).is_file(), name
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"]


def test_model_card_has_front_matter_losses_command_hardware_and_sample(trained, small_data_path):
    from huggingface_hub import ModelCard

    trainer, result, out = trained
    card = ModelCard.load(out / "README.md")
    data = card.data
    assert (data.library_name, data.pipeline_tag, data.license) == ("transformers", "text-generation", "mit")
    assert data.datasets is None and data.language is None  # a slice of the corpus: not the Hub dataset
    val, train = data.eval_results
    assert (val.metric_value, val.dataset_split) == (round(result["val_loss"], 4), "validation")
    assert train.metric_value == round(result["train_loss"], 4)
    assert f"small.txt (sha256 {trainer.corpus.sha256})" in val.dataset_name
    body = card.text
    assert "pytest run" in body and "hardware" in body and "wall time" in body and "## Sample" in body
    assert "small.txt" in body.split("\n\n")[1]  # "trained ... on small.txt (sha256 ...)", not Tiny Shakespeare
    sample = body.split("## Sample")[1].split("```")[1].strip("\n")
    assert len(sample) == 20
    use = body.split("## Use")[1].split("## Sample")[0]
    assert json.dumps(trainer.corpus.default_prompt) in use and "ROMEO" not in use  # the model's own text


def test_the_folder_records_its_corpus(trained, small_data_path):
    from gpt_serve.folders.corpus_record import CorpusRecord, read_corpus_record

    trainer, _, out = trained
    record = read_corpus_record(out)
    assert record == trainer.corpus and record.name == "small.txt"
    text = small_data_path.read_text(encoding="utf-8")
    assert record.source == str(small_data_path.resolve()) and record.find_text() == text
    assert record == CorpusRecord.of(text, small_data_path)
    assert record.prompts and all(("\n" + text).count("\n" + p) for p in record.prompts)  # starts of real lines


def test_model_card_names_the_hub_dataset_for_tiny_shakespeare_and_parses_for_any_folder_name(tmp_path, corpus):
    from huggingface_hub import ModelCard

    from gpt_serve.folders.corpus_record import CorpusRecord
    from training.report import card_data

    data = card_data("x: y", 1.4786, 1.31, CorpusRecord.of(corpus, "input.txt"))
    assert data.datasets == ["karpathy/tiny_shakespeare"] and data.language == ["en"]
    assert data.widget[0] == {"text": "ROMEO:"}  # the Hub's widget examples: the corpus's prompts
    path = tmp_path / "README.md"
    ModelCard(f"---\n{data.to_yaml()}\n---\n# x: y\n").save(path)
    loaded = ModelCard.load(path).data
    assert loaded.model_name == "x: y" and loaded.eval_results[0].metric_value == 1.4786
    assert loaded.eval_results[0].dataset_type == "karpathy/tiny_shakespeare"


def test_loss_plot_and_metrics_are_written_at_every_evaluation(tmp_path, make_config, monkeypatch):
    from training import trainer as trainer_mod

    plots = []
    real = trainer_mod.save_loss_plot
    monkeypatch.setattr(trainer_mod, "save_loss_plot", lambda h, p, **kw: (plots.append(len(h)), real(h, p, **kw)))
    Trainer(make_config(tmp_path, max_iters=20, eval_interval=10, sample_tokens=0)).fit()
    assert plots == [1, 2, 3]  # steps 0, 10, 20
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 10, 20]
    assert {"train_loss", "val_loss", "lr", "tokens", "time_s"} <= set(json.loads(lines[-1]))


def lr_factors(cfg, steps):
    """The multiplier of the learning rate at each of `steps`, from the trainer's scheduler."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.learning_rate)
    scheduler = make_scheduler(cfg, optimizer)
    return [scheduler.lr_lambdas[0](s) for s in steps]


def test_lr_schedules():
    const = TrainConfig(learning_rate=1e-3, max_iters=100)
    assert lr_factors(const, (0, 50, 99)) == [1.0, 1.0, 1.0]
    cos = TrainConfig(learning_rate=1e-3, min_lr=1e-4, schedule="cosine", warmup_iters=10, max_iters=110)
    assert lr_factors(cos, (0, 4, 9)) == pytest.approx([0.0, 0.4, 0.9])  # transformers' warmup starts at 0
    assert lr_factors(cos, (10, 60, 110)) == pytest.approx([1.0, 0.1 + 0.9 * 0.5, 0.1])  # to min_lr / learning_rate
    decay = lr_factors(cos, range(10, 111))
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))


def _params(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_gradient_accumulation_equals_one_big_batch(tmp_path, make_config):
    # Two micro-batches of 4 draw the same 8 windows as one batch of 8 (same generator stream).
    big = Trainer(make_config(tmp_path / "big", batch_size=8))
    acc = Trainer(make_config(tmp_path / "acc", batch_size=4, grad_accum=2))
    torch.testing.assert_close(_params(big), _params(acc), rtol=0, atol=0)
    loss_big, loss_acc = big.train_step(), acc.train_step()
    torch.testing.assert_close(loss_acc, loss_big, rtol=1e-6, atol=1e-6)
    # AdamW's first step divides each gradient by its own magnitude: a weight whose gradient is ~0 moves by the
    # summation order's rounding noise (seen: 5e-6 on one weight of 4096)
    torch.testing.assert_close(_params(acc), _params(big), rtol=1e-5, atol=1e-5)
    assert big.tokens_per_step == acc.tokens_per_step == 8 * 16


def test_gradient_clipping_limits_the_update(tmp_path, make_config):
    def first_update(clip):
        t = Trainer(make_config(tmp_path / f"clip{clip}", grad_clip=clip))
        before = _params(t)
        t.train_step()
        return max(float((v - before[k]).abs().max()) for k, v in _params(t).items())

    # Adam divides by sqrt(v) + eps: a gradient clipped to norm 1e-10 moves weights ~100x less than lr.
    assert first_update(0.0) == pytest.approx(3e-3, rel=0.05)  # AdamW's first step moves each weight by ~lr
    assert first_update(1e-10) < 3e-4


def test_evaluation_does_not_change_training(tmp_path, make_config):
    """Evaluation draws from its own generator and runs without dropout: the basis of exact resume."""
    a = Trainer(make_config(tmp_path / "a", max_iters=12, eval_interval=3, sample_tokens=0, model={"dropout": 0.1}))
    b = Trainer(make_config(tmp_path / "b", max_iters=12, eval_interval=12, sample_tokens=0, model={"dropout": 0.1}))
    a.fit()
    b.fit()
    torch.testing.assert_close(_params(a), _params(b), rtol=0, atol=0)


def test_keep_best_and_patience_stop_early_with_the_best_weights(tmp_path, make_config, monkeypatch):
    scripted = iter([4.0, 3.0, 3.5, 3.6, 3.7, 3.8])
    snapshots = {}

    def fake_estimate(self):
        snapshots[self.step] = _params(self)
        val = next(scripted)
        return {"train": val, "val": val}

    monkeypatch.setattr(Trainer, "estimate_loss", fake_estimate)
    t = Trainer(make_config(tmp_path, max_iters=50, eval_interval=5, keep_best=True, patience=2, sample_tokens=0))
    result = t.fit()
    assert result["stopped_early"] and result["final_step"] == 15  # evals at 0, 5 (best), 10, 15: two misses
    assert result["step"] == 5 and result["val_loss"] == 3.0
    torch.testing.assert_close(_params(t), snapshots[5], rtol=0, atol=0)
    from gpt_serve import CharGPTForCausalLM

    saved = CharGPTForCausalLM.from_pretrained(tmp_path)
    torch.testing.assert_close({k: v for k, v in saved.state_dict().items()}, snapshots[5], rtol=0, atol=0)
    assert "stopped early at step 15" in (tmp_path / "README.md").read_text()


def test_cpu_runs_fp32_uncompiled_with_the_asked_threads(tmp_path, make_config):
    old = torch.get_num_threads()
    try:
        t = Trainer(make_config(tmp_path, threads=1))
        assert torch.get_num_threads() == 1
        assert t.rt.device.type == "cpu" and t.rt.autocast_dtype is None and not t.compiled
        assert t.forward_model is t.model and not t.rt.ddp
        assert all(p.dtype == torch.float32 for p in t.model.parameters())
        assert t.loss_on(*t.dataset.get_batch("train", 2, torch.Generator())).dtype == torch.float32
    finally:
        torch.set_num_threads(old)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error(tmp_path, make_config):
    with pytest.raises(ValueError, match="no CUDA device is available"):
        Trainer(make_config(tmp_path, device="cuda"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 0}, "--batch-size must be >= 1, got 0"),
        ({"max_iters": 0}, "--max-iters must be >= 1, got 0"),
        ({"schedule": "linear"}, "--schedule must be one of"),
        ({"learning_rate": 0.0}, "--learning-rate must be > 0"),
        ({"patience": 3}, "--patience .* needs --keep-best"),
        ({"model": {"n_layers": 2}}, r"unknown model config argument\(s\) --model.n_layers; --model.KEY takes"),
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path, make_config, overrides, message):
    with pytest.raises(ValueError, match=message):
        Trainer(make_config(tmp_path, **overrides))


def test_lr_is_logged_and_follows_the_schedule(tmp_path, make_config):
    t = Trainer(
        make_config(
            tmp_path, max_iters=20, eval_interval=10, schedule="cosine", warmup_iters=5, min_lr=3e-4, sample_tokens=0
        )
    )
    t.fit()
    lrs = [m["lr"] for m in read_metrics(tmp_path)]
    assert lrs[0] == 0.0 and lrs[-1] == pytest.approx(3e-4)  # transformers' warmup starts from 0
    assert not math.isclose(lrs[1], 3e-3)


@pytest.mark.skipif(available_cpus() < 2, reason="needs 2 CPUs to tell 2 threads from 1")
def test_the_cards_hardware_line_names_the_threads_asked_for(tmp_path, make_config, monkeypatch):
    """The sample's decoding may drop PyTorch to one thread (the backend's thread tuner, after a stall on a busy
    machine): the card still names the count the run trained with, and the count is back afterwards."""
    import gpt_serve.generation

    def stalled_sample(*args, **kwargs):
        torch.set_num_threads(1)
        return "x"

    monkeypatch.setattr(gpt_serve.generation, "generate_text", stalled_sample)
    old = torch.get_num_threads()
    try:
        Trainer(make_config(tmp_path, threads=2, max_iters=2, eval_interval=2)).fit()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    assert "PyTorch threads: 2, fp32" in (tmp_path / "README.md").read_text()


def test_the_run_says_how_long_it_has_left(tmp_path, make_config, caplog):
    caplog.set_level("INFO", logger="training.trainer")
    Trainer(make_config(tmp_path, max_iters=45, eval_interval=15, sample_tokens=0)).fit()
    lines = [r.getMessage() for r in caplog.records]
    early = [line for line in lines if line.startswith("step 20 of 45: about ")]
    assert len(early) == 1 and re.search(r"left \(\d+\.\d\d s a step, \d+\.\d s an evaluation\)$", early[0])
    evals = [line for line in lines if line.startswith("step ") and "val loss" in line]
    assert [("left (" in line) for line in evals] == [False, True, True, False]  # not at step 0 nor at the end


def test_time_left_counts_steps_and_evaluations():
    assert time_left(0, 100, 10, 0.5, 2.0) == 100 * 0.5 + 10 * 2.0
    assert time_left(95, 100, 10, 0.5, 2.0) == 5 * 0.5 + 1 * 2.0
    assert time_left(20, 25, 10, 1.0, 3.0) == 5 + 3.0  # the last step is evaluated, though not a multiple of 10
