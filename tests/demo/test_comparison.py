"""The page's comparison: a model whose training kept snapshots is compared with its own earlier checkpoints (each
column labelled with its step and validation loss, a snapshot that cannot run saying why in its column); the
Shakespeare model keeps the ladder; a model with neither has no comparison."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.demo.conftest import form

LADDER_TITLE = "Compare the ladder: what each lesson component buys"


def save_model(folder: Path, tokenizer, record, seed: int, step=None) -> None:
    from gpt_serve.folders.corpus_record import write_corpus_record
    from gpt_serve.folders.snapshots import StepRecord, write_step_record
    from tests.conftest import make_tiny_model

    model = make_tiny_model(seed=seed, vocab_size=tokenizer.vocab_size)
    model.config.vocab_sha256 = tokenizer.vocab.sha256
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_corpus_record(folder, record)
    if step is not None:
        write_step_record(folder, StepRecord(*step))


@pytest.fixture(scope="module")
def own_root(tmp_path_factory, models_root) -> Path:
    """The test models plus `code` (its own text and vocabulary), trained to step 40, and its snapshots: steps 10 and
    20 good, 25 with damaged weights, 30 with a damaged step record, 35 of another vocabulary."""
    from gpt_serve import CharTokenizer
    from gpt_serve.folders.corpus_record import CorpusRecord

    root = Path(shutil.copytree(models_root, tmp_path_factory.mktemp("own") / "models"))
    text = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n\nimport os\n" * 40
    tokenizer, record = CharTokenizer.from_corpus(text), CorpusRecord.of(text, name="tiny code")
    code = root / "code"
    save_model(code, tokenizer, record, seed=0, step=(40, 1.234, 1.1))
    snapshots = code / "snapshots"
    save_model(snapshots / "step-000010", tokenizer, record, seed=1, step=(10, 3.456, 3.4))
    save_model(snapshots / "step-000020", tokenizer, record, seed=2, step=(20, 2.5, 2.4))
    save_model(snapshots / "step-000025", tokenizer, record, seed=3, step=(25, 2.2, 2.1))
    (snapshots / "step-000025" / "model.safetensors").write_bytes(b"not a safetensors file")
    save_model(snapshots / "step-000030", tokenizer, record, seed=4)
    (snapshots / "step-000030" / "step.json").write_text("{broken")
    other = CharTokenizer.from_corpus("abc\n")
    save_model(snapshots / "step-000035", other, record, seed=5, step=(35, 1.5, 1.4))
    return root


@pytest.fixture(scope="module")
def own(own_root):
    from demo.app import build_demo
    from gpt_serve.serving.registry import ModelRegistry

    registry = ModelRegistry.discover(models_root=own_root, threads=1)
    demo = build_demo(registry, default_model="code", stream_interval=0.0, max_updates_per_second=None,
                      max_tokens_limit=500)  # fmt: skip
    yield demo
    demo.handlers.close()
    registry.close()


def test_a_model_with_snapshots_is_compared_with_its_earlier_checkpoints(own):
    comparison = own.handlers.comparison
    assert comparison.kind == "checkpoints"
    assert [c.label for c in comparison.columns] == [
        "step 10 · val loss 3.46",
        "step 20 · val loss 2.50",
        "step 25 · val loss 2.20",
        "step 30 (cannot run)",
        "step 35 · val loss 1.50 (cannot run)",
        "code · step 40 · val loss 1.23",  # the model itself, last
    ]
    assert [c.elem_id for c in comparison.columns][:2] == ["compare-step-000010", "compare-step-000020"]
    assert own.handlers.compared[-1] == "code" and own.handlers.compared[0] == "code@step-000010"
    words = " ".join([comparison.title, comparison.intro, comparison.button])
    assert comparison.title == "Compare with earlier checkpoints: what more training bought"
    assert comparison.button == "Compare with earlier checkpoints" and "ladder" not in words.lower()
    config = json.dumps(own.get_config_file(), default=str)
    assert comparison.title in config and "compare-step-000010" in config and LADDER_TITLE not in config
    assert "Compare the ladder" not in config


def test_the_snapshots_are_no_models_of_the_servers_list(own):
    assert not [n for n in own.registry.names if "@" in n]  # served by the comparison's own registry only
    assert own.handlers.comparison.own.names == [f"code@step-0000{s}" for s in (10, 20, 25, 30, 35)]


def test_the_comparison_runs_every_checkpoint_and_says_why_one_cannot(own):
    updates = list(own.handlers.ui_compare(None, None, *form(model="code", prompt="def ", max_new_tokens=12, seed=5)))
    *texts, _ = updates[-2]
    step10, step20, step25, step30, step35, final = texts
    assert len(step10) == len(step20) == len(final) == 12 and len({step10, step20, final}) == 3
    assert "cannot serve model 'code@step-000025'" in step25  # its weights fail to load: said when it runs
    assert step30.startswith("Not compared: cannot read ") and "step-000030/step.json" in step30
    assert step35.startswith("Not compared: ") and "reads other characters than 'code'" in step35
    assert updates[-1][-1] == (  # never "the same settings in every column" over columns that could not run
        "Done: the prompt `def ` (seed 5) ran in 3 of 6 columns, the same settings in each; 3 columns could not run "
        "it (the column says why)."
    )


def test_the_shakespeare_model_keeps_the_ladder(registry):
    from demo.app import build_demo

    handlers = build_demo(registry, default_model="tiny").handlers
    comparison = handlers.comparison
    assert comparison.kind == "ladder" and comparison.title == LADDER_TITLE
    assert comparison.button == "Compare the ladder" and comparison.own is None
    assert handlers.compared == ["tiny", "ladder-a", "ladder-b", "ladder-c", "ladder-d", "ladder-e"]
    assert [c.label for c in comparison.columns][:3] == ["tiny", "A · val loss 3.25", "B"]
    assert comparison.intro.startswith(
        "Runs the prompt, seed and sampling settings above through the default model (`tiny`) and the stages of the "
        "lesson's ladder (A–E) that read the same characters, side by side."
    )


def test_a_model_without_snapshots_or_a_shared_vocabulary_has_no_comparison(own_root, tmp_path):
    from demo.app import build_demo
    from gpt_serve.serving.registry import ModelRegistry

    root = Path(shutil.copytree(own_root, tmp_path / "models"))
    shutil.rmtree(root / "code" / "snapshots")
    registry = ModelRegistry.discover(models_root=root, threads=1)
    demo = build_demo(registry, default_model="code")
    assert demo.handlers.comparison is None and demo.handlers.compared == ["code"]
    assert "compare-btn" not in json.dumps(demo.get_config_file(), default=str)


def test_at_most_seven_snapshots_are_shown_evenly_spread(tmp_path, own_root):
    from demo.comparison import MAX_SNAPSHOT_COLUMNS, comparison_for, spread
    from gpt_serve.serving.registry import ModelRegistry

    assert spread(list(range(10)), 4) == [0, 3, 6, 9] and spread([1, 2], 7) == [1, 2] and spread([1, 2, 3], 1) == [3]
    root = tmp_path / "models"
    shutil.copytree(own_root / "code", root / "code", ignore=shutil.ignore_patterns("snapshots"))
    good = own_root / "code" / "snapshots" / "step-000010"
    for step in range(1, 13):
        shutil.copytree(good, root / "code" / "snapshots" / f"step-{step * 100:06d}")
    registry = ModelRegistry.discover(models_root=root, threads=1)
    comparison = comparison_for(registry, "code")
    assert len(comparison.columns) == MAX_SNAPSHOT_COLUMNS + 1 == 8
    assert comparison.columns[0].elem_id == "compare-step-000100" and comparison.columns[-2].elem_id.endswith("1200")
    assert "(7 of the 12 it holds)" in comparison.intro
    comparison.close()


@pytest.fixture(scope="module")
def tuned_root(tmp_path_factory, models_root) -> Path:
    """The test models plus `tuned`, fine-tuned from `tiny` (its card's base_model; its step-0 loss 2.95), and
    `orphan`, fine-tuned from a model this server does not serve."""
    from gpt_serve import CharTokenizer
    from gpt_serve.folders.corpus_record import CorpusRecord

    root = Path(shutil.copytree(models_root, tmp_path_factory.mktemp("tuned") / "models"))
    tokenizer = CharTokenizer.from_pretrained(root / "tiny")
    record = CorpusRecord.of("To be, or not to be, that is the question:\n" * 20, name="a speech")
    metrics = [{"step": 0, "train_loss": 2.9, "val_loss": 2.95}, {"step": 40, "train_loss": 1.9, "val_loss": 2.0}]
    for name, base in (("tuned", "tiny"), ("orphan", "elsewhere")):
        save_model(root / name, tokenizer, record, seed=7)
        (root / name / "README.md").write_text(f"---\nbase_model: {base}\n---\n\n# {name}\n")
        (root / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return root


def test_a_fine_tuned_model_is_compared_with_its_base(tuned_root):
    from demo.app import build_demo
    from gpt_serve.serving.registry import ModelRegistry

    registry = ModelRegistry.discover(models_root=tuned_root, threads=1)
    demo = build_demo(registry, default_model="tuned", stream_interval=0.0, max_updates_per_second=None)
    comparison = demo.handlers.comparison
    assert comparison.kind == "base" and comparison.title == "Compare with the base model: what fine-tuning bought"
    assert [c.label for c in comparison.columns] == ["tiny · base · val loss 2.95", "tuned · val loss 2.00"]
    assert (
        demo.handlers.compared == ["tiny", "tuned"] and "`tiny`, the model `tuned` was fine-tuned" in comparison.intro
    )
    updates = list(demo.handlers.ui_compare(None, None, *form(model="tuned", max_new_tokens=8, seed=5)))
    base_text, tuned_text, status = updates[-2]
    assert len(base_text) == len(tuned_text) == 8 and base_text != tuned_text
    assert updates[-1][-1].startswith("Done: the prompt `ROMEO:` (seed 5)")
    demo.handlers.close()


def test_a_base_that_is_not_served_leaves_the_ladder(tuned_root):
    from demo.comparison import comparison_for, served_base
    from gpt_serve.serving.registry import ModelRegistry

    registry = ModelRegistry.discover(models_root=tuned_root, threads=1)
    assert served_base(registry, "orphan") is None and served_base(registry, "tuned") == "tiny"
    assert comparison_for(registry, "orphan").kind == "ladder"  # the tiny vocabulary: the ladder's stages share it


def test_a_fine_tuned_model_with_snapshots_puts_its_base_first(tuned_root, tmp_path, tokenizer):
    from demo.comparison import comparison_for
    from gpt_serve.folders.corpus_record import CorpusRecord
    from gpt_serve.serving.registry import ModelRegistry

    root = Path(shutil.copytree(tuned_root, tmp_path / "models"))
    save_model(root / "tuned" / "snapshots" / "step-000020", tokenizer, CorpusRecord.of("ab\n" * 9), 8, (20, 2.5, 2.4))
    comparison = comparison_for(ModelRegistry.discover(models_root=root, threads=1), "tuned")
    assert comparison.kind == "checkpoints"
    assert [c.label for c in comparison.columns] == [
        "tiny · base · val loss 2.95",
        "step 20 · val loss 2.50",
        "tuned · val loss 2.00",
    ]
    assert "The first column is `tiny`, the model it was fine-tuned from" in comparison.intro
    comparison.close()
