"""Conformance: one table of requests, run through every surface that takes them; every case must give identical
text on every surface, or the same refusal with the same message.

Surfaces: the library (`generate_text`), the CLI (`gpt-serve generate`, in process), the OpenAI API (`gpt-serve
serve`'s app, plain and streamed), a Ray Serve replica's app (`replica_app`, what each replica serves), the demo's
`/generate` function, a request on a shared scheduler beside other running requests; and, for greedy requests,
transformers' `generate` (torch), a plain onnxruntime loop over `onnx/model.onnx` (fp32) and onnxruntime-genai
(inside its `context_length`, held to our engine on the int8 graph it runs: see `genai`). The browser page's engine
is held to the same tokens by `tests/demo/test_web_engine.py`. A surface that does not carry a case's fields (the
demo has no `stop`; the runtimes have no parser of ours) is left out of that case, never passed.

The shipped model (block_size 128) on each backend; the window cases run past block_size.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gpt_serve.chargpt.window import window_keep, window_start
from gpt_serve.generation import RequestError, SamplingParams, generate_text, load_backend
from gpt_serve.generation.fields import MAX_SEED
from gpt_serve.generation.spec import parse_request
from gpt_serve.generation.text import TextStream, encode_prompt
from gpt_serve.models import MODELS_DIR, model_path
from gpt_serve.serving.registry import ModelRegistry
from tests.helpers import genai_greedy

MODEL = "shakespeare"
BACKENDS = ("torch", "onnx", "onnx-int8")
SHAKESPEARE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\n"
    "You are all resolved rather to die than to famish?\n"
)  # 124 characters: a few tokens more pass block_size 128


# OpenAI's upper bounds of temperature and top_k hold what a user sends (every surface that parses a request); the
# library's `SamplingParams` meets only the engine's own bounds and takes past them
# (tests/generation/test_inline.py::test_the_engine_takes_what_only_the_wire_refuses)
WIRE_ONLY = ("library",)


@dataclass(frozen=True)
class Case:
    name: str
    fields: dict
    refusal: str | None = None  # the start of the message every surface must give
    # the refusal's remedy names each surface's own control (the CLI's flag, the page's choice): only the problem,
    # `refusal`, must read alike
    remedy_per_surface: bool = False
    surfaces_without: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.fields.get("temperature", 1.0) == 0

    def within_window(self, block_size: int, vocab) -> bool:
        ids = encode_prompt(vocab, self.fields.get("prompt", ""), self.fields.get("unk_policy", "error"))
        return len(ids) + self.fields.get("max_new_tokens", 256) <= block_size


VOCAB_CHARS = "".join(json.loads((model_path(MODEL) / "vocab.json").read_text(encoding="utf-8")))
G = dict(temperature=0, max_new_tokens=24)
SPEAKER_LINE = r"[A-Z][A-Z ]{1,20}:\n[A-Z][a-z ,]{3,40}[.!?]"
SPEAKER_GRAMMAR = (
    'start: NAME ":\\n" LINE\nNAME: /[A-Z][A-Z ]{1,20}/\nLINE: /[A-Z][a-z ,]{3,40}[.!?]/\n'  # the same, in Lark
)

CASES = [
    Case("spaces and newlines", dict(prompt="a b\nc d, e", **G)),
    Case("punctuation", dict(prompt="ROMEO: What, ho!--art thou; there? 'Tis I & $3.", **G)),
    Case("every vocabulary character", dict(prompt=VOCAB_CHARS, **G)),
    Case("the empty prompt", dict(prompt="", **G)),
    Case("a newline alone", dict(prompt="\n", **G)),
    Case("sampled", dict(prompt="JULIET:\n", temperature=0.8, top_k=20, top_p=0.95, seed=3, max_new_tokens=40)),
    Case(
        "repetition penalty",
        dict(prompt="ROMEO:", temperature=0, repetition_penalty=1.3, max_new_tokens=30),
        surfaces_without=("demo",),
    ),  # fmt: skip
    Case("stop strings", dict(prompt="ROMEO:\n", stop=["\n\n", "KING"], **G), surfaces_without=("demo",)),
    Case(
        "unknown characters, refused",
        dict(prompt="ROMEO: ¿qué?", **G),
        refusal="the prompt has 2 characters outside this model's vocabulary: '¿' (position 7), 'é' (position 10).",
        remedy_per_surface=True,
    ),
    Case("unknown characters, replaced", dict(prompt="ROMEO: ¿qué?", unk_policy="replace", **G)),
    Case("unknown characters, dropped", dict(prompt="ROMEO: ¿qué?", unk_policy="drop", **G)),
    Case("nothing left once dropped", dict(prompt="¿é", unk_policy="drop", **G), refusal="the prompt has no character"),
    Case("temperature at its edge", dict(prompt="ROMEO:", temperature=2, seed=1, max_new_tokens=20)),
    Case(
        "temperature past its edge",
        dict(prompt="ROMEO:", temperature=2.5),
        refusal="temperature must be a number in [0, 2] (0 = greedy), got 2.5",
        surfaces_without=WIRE_ONLY,
    ),
    Case("max_new_tokens at its edge", dict(prompt="ROMEO:", temperature=0, max_new_tokens=1)),
    Case(
        "max_new_tokens past its edge",
        dict(prompt="ROMEO:", max_new_tokens=0),
        refusal="max_new_tokens must be an integer in [1, 100000], got 0",
    ),
    Case("top_p at its edge", dict(prompt="ROMEO:", temperature=1, top_p=1, seed=2, max_new_tokens=20)),
    Case("top_p past its edge", dict(prompt="ROMEO:", top_p=0), refusal="top_p must be a number in (0, 1], got 0"),
    Case("top_k at its edge", dict(prompt="ROMEO:", temperature=1, top_k=1_000_000, seed=4, max_new_tokens=20)),
    Case(
        "top_k past its edge",
        dict(prompt="ROMEO:", top_k=1_000_001),
        refusal="top_k must be an integer in [0, 1000000] (0 = no limit), got 1000001",
        surfaces_without=WIRE_ONLY,
    ),
    Case("a prompt at its limit", dict(prompt=("ROMEO: " * 1500)[:10_000], **G)),
    Case(
        "a prompt past its limit",
        dict(prompt="R" * 10_001),
        refusal="prompt is 10,001 characters long; the limit is 10,000",
    ),
    Case(
        "five stop strings",
        dict(prompt="ROMEO:", stop=["a", "b", "c", "d", "e"]),
        refusal="stop must be a string or a list of at most 4 non-empty strings",
        surfaces_without=("demo",),
    ),
    Case("seed 0", dict(prompt="ROMEO:", temperature=1, seed=0, max_new_tokens=20)),
    Case("the largest seed", dict(prompt="ROMEO:", temperature=1, seed=MAX_SEED, max_new_tokens=20)),
    Case(
        "a seed past the largest",
        dict(prompt="ROMEO:", seed=MAX_SEED + 1),
        refusal="seed must be an integer in [0, 9007199254740991] (null or -1 = random), got 9007199254740992",
    ),
    Case("exact window past block_size", dict(prompt=SHAKESPEARE, window_mode="exact", **G)),
    Case("refill window past block_size", dict(prompt=SHAKESPEARE, window_mode="refill", **G)),
    Case(
        "refill_tokens past block_size",
        dict(prompt=SHAKESPEARE, window_mode="refill", refill_tokens=20, **G),
        surfaces_without=("demo",),
    ),
    Case(
        "sampled past block_size",
        dict(prompt=SHAKESPEARE, window_mode="refill", temperature=0.9, seed=11, max_new_tokens=40),
    ),
    # structured outputs (docs/structured.md; the demo's /generate takes structured_outputs, not logit_bias)
    Case(
        "a regex, greedy",
        dict(prompt="ROMEO:\n", structured_outputs={"regex": SPEAKER_LINE}, **G),
    ),
    Case(
        "a regex, sampled",
        dict(prompt="ROMEO:\n", structured_outputs={"regex": SPEAKER_LINE}, temperature=1, seed=6, max_new_tokens=80),
    ),
    Case(
        "choices, sampled",
        dict(
            prompt="Wilt thou?\n",
            structured_outputs={"choice": ["Ay.", "No, my lord.", "Nay"]},
            seed=2,
            max_new_tokens=20,
        ),
    ),
    Case(
        "a regex past block_size",
        dict(prompt=SHAKESPEARE, structured_outputs={"regex": "[a-z ]+"}, temperature=0.9, seed=7, max_new_tokens=30),
    ),
    Case(
        "logit_bias",
        dict(prompt="ROMEO:", logit_bias={str(VOCAB_CHARS.index("e")): -100}, temperature=1, seed=8, max_new_tokens=40),
        surfaces_without=("cli", "demo"),
    ),
    Case(
        "a JSON schema the vocabulary cannot write",
        dict(
            prompt="ROMEO:", structured_outputs={"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}
        ),
        refusal="structured_outputs.json: this model's vocabulary cannot write any text the constraint accepts: it "
        "lacks the characters '\"' '0' '1' '2' '4' '5' '6' '7' '8' '9' '{' '}'",
    ),
    Case(
        "a malformed regex",
        dict(prompt="ROMEO:", structured_outputs={"regex": "[A-Z"}),
        refusal="structured_outputs.regex: the regex is malformed or unsupported",
    ),
    Case("a grammar, greedy", dict(prompt="ROMEO:\n", structured_outputs={"grammar": SPEAKER_GRAMMAR}, **G)),
    Case(
        "a grammar, sampled",
        dict(
            prompt="ROMEO:\n", structured_outputs={"grammar": SPEAKER_GRAMMAR}, temperature=1, seed=6, max_new_tokens=80
        ),
    ),
    Case(
        "an EBNF grammar, sampled",
        dict(
            prompt="Wilt thou?\n",
            structured_outputs={"grammar": 'root ::= ("Ay" | "No, my lord") [.!]'},
            seed=2,
            max_new_tokens=20,
        ),
    ),
    Case(
        "a malformed grammar",
        dict(prompt="ROMEO:", structured_outputs={"grammar": "start: NAME"}),
        refusal='structured_outputs.grammar: the grammar is malformed or unsupported: at 1(8): unknown name: "NAME"',
    ),
    Case(
        "a grammar the vocabulary cannot write",
        dict(prompt="ROMEO:", structured_outputs={"grammar": 'start: "{" /[a-z]+/ "}"'}),
        refusal="structured_outputs.grammar: this model's vocabulary cannot write the first character of any text the "
        "grammar accepts: it lacks the characters '{'",
    ),
]


@dataclass
class Surfaces:
    registry: ModelRegistry
    api: object
    replica: object
    handlers: object
    loaded: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def surfaces():
    from fastapi.testclient import TestClient

    from demo.handlers import DemoHandlers
    from demo.progress import Activity
    from gpt_serve.generation.fields import MAX_NEW_TOKENS
    from gpt_serve.serving.api import create_app
    from gpt_serve.serving.ray_serve import RayServeOptions, replica_app

    registry = ModelRegistry.discover(models_root=MODELS_DIR, expected=(), threads=1)
    options = RayServeOptions(threads=1, preload=False)
    with TestClient(create_app(registry)) as api, TestClient(replica_app(options, "r0")) as replica:
        handlers = DemoHandlers(registry, MAX_NEW_TOKENS, Activity(), 0.0, MODEL, "torch", max_updates_per_second=None)
        yield Surfaces(registry, api, replica, handlers)
    registry.close()


@pytest.fixture(scope="module")
def loaded():
    return {b: load_backend(MODEL, b, threads=1) for b in BACKENDS}


class Refused(Exception):
    """A surface's refusal, with its message as the surface shows it (the wire format's text)."""


def library(s, loaded, backend, f):
    try:
        sampling = SamplingParams(
            f.get("temperature", 1.0), f.get("top_k"), f.get("top_p", 1.0), f.get("repetition_penalty", 1.0)
        )
        keys = ("seed", "window_mode", "refill_tokens", "stop", "unk_policy", "structured_outputs", "logit_bias")
        kwargs = {k: f[k] for k in keys if k in f}
        m = loaded[backend]
        return generate_text(m.backend, m.vocab, f.get("prompt", ""), f.get("max_new_tokens", 256), sampling, **kwargs)
    except RequestError as e:
        raise Refused(str(e)) from None


def cli(s, loaded, backend, f):
    from gpt_serve import cli as cli_module
    from gpt_serve.cli import generate as generate_command

    argv = ["generate", MODEL, "--no-echo", f"--prompt={f.get('prompt', '')}", f"--backend={backend}"]
    for key, flag in [
        ("max_new_tokens", "--max-new-tokens"),
        ("temperature", "--temperature"),
        ("top_k", "--top-k"),
        ("top_p", "--top-p"),
        ("repetition_penalty", "--repetition-penalty"),
        ("seed", "--seed"),
        ("window_mode", "--window-mode"),
        ("refill_tokens", "--refill-tokens"),
        ("unk_policy", "--unk-policy"),
    ]:
        if key in f:
            argv.append(f"{flag}={f[key]}")
    for stop in f.get("stop", ()):
        argv.append(f"--stop={stop}")
    structured = f.get("structured_outputs", {})
    argv += [f"--regex={structured['regex']}"] if "regex" in structured else []
    argv += [f"--choice={c}" for c in structured.get("choice", ())]
    if "json" in structured:
        schema = Path(tempfile.mkdtemp()) / "schema.json"
        schema.write_text(json.dumps(structured["json"]), encoding="utf-8")
        argv.append(f"--json-schema={schema}")
    if "grammar" in structured:
        grammar = Path(tempfile.mkdtemp()) / "grammar.lark"
        grammar.write_text(structured["grammar"], encoding="utf-8")
        argv.append(f"--grammar={grammar}")
    out, err = io.StringIO(), io.StringIO()
    original = generate_command.load_backend
    generate_command.load_backend = lambda model, key, threads: loaded[key]  # the model is loaded once for all cases
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_module.main(argv)
    finally:
        generate_command.load_backend = original
    if code != 0:
        message = err.getvalue().strip()
        assert message.startswith("gpt-serve: error: ") and code == 2, message
        raise Refused(message.removeprefix("gpt-serve: error: "))
    assert out.getvalue().endswith("\n")
    return out.getvalue()[:-1]


def _openai_body(backend, f, stream=False):
    body = {"model": MODEL, "backend": backend, "stream": stream, **f}
    body["max_tokens"] = body.pop("max_new_tokens", 256)
    return body


def _completion(client, backend, f):
    answer = client.post("/v1/completions", json=_openai_body(backend, f))
    if answer.status_code != 200:
        assert answer.status_code == 400, answer.text
        raise Refused(answer.json()["error"]["message"])
    return answer.json()["choices"][0]["text"]


def api(s, loaded, backend, f):
    return _completion(s.api, backend, f)


def api_streamed(s, loaded, backend, f):
    with s.api.stream("POST", "/v1/completions", json=_openai_body(backend, f, stream=True)) as answer:
        if answer.status_code != 200:
            raise Refused(json.loads(answer.read())["error"]["message"])
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return "".join(c["text"] for line in lines[:-1] for c in json.loads(line[6:])["choices"])


def ray_replica(s, loaded, backend, f):
    return _completion(s.replica, backend, f)


def demo(s, loaded, backend, f):
    """The demo's /generate function; for a regex or choices also the page's Generate with its Format control set to
    them, which must give the same text, or the same refusal in the control's words."""
    import gradio as gr

    from demo.captions import FAILED
    from demo.format_control import page_message

    keys = (
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "window_mode",
        "unk_policy",
        "structured_outputs",
    )
    kwargs = {k: f[k] for k in keys if k in f}
    try:
        texts = list(s.handlers.api_generate()(f.get("prompt", ""), backend=backend, model=MODEL, **kwargs))
        result = texts[-1] if texts else ""
    except gr.Error as e:
        result = Refused(e.message)
    if {"regex", "choice"} & set(f.get("structured_outputs", {})):
        said = (
            isinstance(result, Refused) and f"{FAILED} {page_message(RequestError(str(result), 'structured_outputs'))}"
        )
        page = demo_page(s, backend, dict(kwargs), f.get("prompt", ""))
        assert page == (said or result), (page, result)
    if isinstance(result, Refused):
        raise result
    return result


def demo_page(s, backend, kwargs, prompt):
    """The page's Generate (`DemoHandlers.ui_generate`) with the Format control set to the request's regex or choices
    (one per line): the text after the prompt, or the status line of a refusal."""
    import inspect

    from demo.handlers import PAGE_FIELDS

    structured = kwargs.pop("structured_outputs")
    kind = "regex" if "regex" in structured else "choice"
    box = structured["regex"] if kind == "regex" else "\n".join(structured["choice"])
    values = {name: p.default for name, p in inspect.signature(s.handlers.generate).parameters.items()}
    values.update(kwargs, prompt=prompt, backend=backend, model=MODEL, format=kind, format_text=box)
    *_, (output, _, status) = s.handlers.ui_generate(None, None, *[values[name] for name in PAGE_FIELDS])
    return output[len(prompt) :] if output else status


def beside_neighbours(s, loaded, backend, f):
    """The request on the registry's shared scheduler while three other requests decode in the same batch."""
    scheduler = s.registry.scheduler(MODEL, backend)
    vocab = s.registry.backend(MODEL, backend).vocab
    neighbours = [
        TextStream(scheduler, vocab, parse_request({"prompt": p, "max_new_tokens": 300, "seed": i}))
        for i, p in enumerate(["KING:", "Q", SHAKESPEARE])
    ]
    try:
        try:
            text = TextStream(scheduler, vocab, parse_request({**f, "backend": backend, "model": MODEL}))
        except RequestError as e:
            raise Refused(str(e)) from None
        return "".join(text)
    finally:
        for n in neighbours:
            n.cancel()


OUR_SURFACES = {
    "library": library,
    "cli": cli,
    "api": api,
    "api (streamed)": api_streamed,
    "ray replica": ray_replica,
    "demo": demo,
    "beside neighbours": beside_neighbours,
}


def hf_generate(case, loaded):
    import torch

    m = loaded["torch"]
    f = case.fields
    ids = encode_prompt(m.vocab, f.get("prompt", ""), f.get("unk_policy", "error"))
    kwargs = {k: f[k] for k in ("window_mode", "refill_tokens") if k in f}
    if "repetition_penalty" in f:
        kwargs["repetition_penalty"] = f["repetition_penalty"]
    end = None
    if "structured_outputs" in f:  # the package's LogitsProcessor over the same automaton
        from gpt_serve.generation.logits_processor import StructuredOutputs

        constraint = StructuredOutputs(m.vocab, structured_outputs=f["structured_outputs"])
        kwargs |= dict(logits_processor=[constraint], stopping_criteria=[constraint.stopping_criteria()])
        end = constraint.end_of
    out = m.backend.pretrained.generate(
        torch.tensor([ids]), do_sample=False, max_new_tokens=f["max_new_tokens"], **kwargs
    )
    return m.vocab.decode(out[0, len(ids) : end(out[0]) if end else None].tolist())


def onnxruntime_loop(case, loaded):
    """Greedy decoding with onnxruntime alone over `onnx/model.onnx`: the Hugging Face I/O names, an empty past to
    start, and the package's window rule past block_size (a fresh past from the window's last tokens)."""
    import onnxruntime as ort

    m, f = loaded["onnx"], case.fields
    session = ort.InferenceSession(str(model_path(MODEL) / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    config = json.loads((model_path(MODEL) / "config.json").read_text())
    n_layer, n_head, block = config["n_layer"], config["n_head"], config["block_size"]
    hs = config["n_embd"] // n_head
    keep = window_keep(block, f.get("window_mode", "refill"), f.get("refill_tokens"))
    ids = encode_prompt(m.vocab, f.get("prompt", ""), f.get("unk_policy", "error"))
    prompt_len, start, past, cached = len(ids), 0, None, 0
    for _ in range(f["max_new_tokens"]):
        new_start = window_start(len(ids), start, block, keep)
        if new_start != start or past is None:  # the window (re)starts: an empty past
            start, cached = new_start, 0
            past = {
                f"past_key_values.{i}.{kind}": np.zeros((1, n_head, 0, hs), np.float32)
                for i in range(n_layer)
                for kind in ("key", "value")
            }
        new = np.array([ids[start + cached :]], dtype=np.int64)
        feeds = {
            "input_ids": new,
            "attention_mask": np.ones((1, len(ids) - start), np.int64),
            "position_ids": np.arange(cached, len(ids) - start, dtype=np.int64)[None],
            **past,
        }
        outputs = session.run(None, feeds)
        names = [o.name for o in session.get_outputs()]
        logits = outputs[names.index("logits")]
        past = {n.replace("present", "past_key_values"): v for n, v in zip(names, outputs) if n.startswith("present")}
        cached = len(ids) - start
        ids.append(int(logits[0, -1].argmax()))
    return m.vocab.decode(ids[prompt_len:])


def genai(case, loaded):
    """onnxruntime-genai's own loop and tokenizer. It runs `onnx/model_quantized.onnx`, the Hugging Face layout
    int8 graph, while the onnx-int8 backend decodes on the in-place graph, whose int8 kernels agree with it within
    the export's tolerance but can break a greedy near-tie the other way: genai is held to our engine on the graph
    it runs (`genai_reference`)."""
    og = pytest.importorskip("onnxruntime_genai")
    f = case.fields
    model = og.Model(str(model_path(MODEL) / "onnx"))
    tokenizer = og.Tokenizer(model)
    prompt = f.get("prompt", "")
    ids = [int(i) for i in tokenizer.encode(prompt)] if prompt else [0]  # the empty prompt: after a newline
    return tokenizer.decode(genai_greedy(og, model, ids, len(ids) + f["max_new_tokens"]))


def genai_reference(case, loaded):
    """Our engine (the library's `generate_text`) on the graph genai runs: `OnnxBackend(..., inplace=False)`."""
    from gpt_serve.generation.backends.onnx_backend import OnnxBackend

    if "hf-int8" not in loaded:
        loaded["hf-int8"] = OnnxBackend(model_path(MODEL), quantized=True, threads=1, inplace=False)
    f = case.fields
    keys = ("window_mode", "refill_tokens", "unk_policy")
    kwargs = {k: f[k] for k in keys if k in f}
    vocab = loaded["onnx-int8"].vocab
    return generate_text(loaded["hf-int8"], vocab, f["prompt"], f["max_new_tokens"], SamplingParams(0), **kwargs)


def runtimes_for(case, backend, loaded):
    """The other runtimes that can run this case: greedy, no field of ours they lack; genai inside its window."""
    f = case.fields
    if case.refusal or not case.greedy or "stop" in f or "logit_bias" in f:
        return {}
    out = {}
    if backend == "torch":
        out["transformers generate"] = hf_generate
    if "structured_outputs" in f:  # only transformers' generate takes a constraint (through our LogitsProcessor)
        return out
    if backend == "onnx" and "repetition_penalty" not in f:
        out["plain onnxruntime"] = onnxruntime_loop
    if (
        backend == "onnx-int8"
        and "repetition_penalty" not in f
        and f.get("unk_policy") != "drop"  # genai replaces unknown characters (a space each): the "replace" policy
        and case.within_window(loaded[backend].block_size, loaded[backend].vocab)
    ):
        out["onnxruntime-genai"] = genai
    return out


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_surface_agrees(surfaces, loaded, case, backend):
    results = {}
    for name, surface in OUR_SURFACES.items():
        if name in case.surfaces_without:
            continue
        try:
            results[name] = ("text", surface(surfaces, loaded, backend, case.fields))
        except Refused as e:
            results[name] = ("refused", str(e))
    for name, runtime in runtimes_for(case, backend, loaded).items():
        if runtime is genai:  # held to our engine on its own graph (see `genai`)
            assert genai(case, loaded) == genai_reference(case, loaded), case.name
            continue
        results[name] = ("text", runtime(case, loaded))
    kinds = {kind for kind, _ in results.values()}
    if case.refusal:
        assert kinds == {"refused"}, results
        for name, (_, message) in results.items():
            assert message.startswith(case.refusal), f"{name}: {message}"
        if case.remedy_per_surface:
            assert "--unk-policy" in results["cli"][1], results["cli"][1]
            results = {name: ("refused", case.refusal) for name in results}
    assert len({value for value in results.values()}) == 1, "surfaces disagree:\n" + "\n".join(
        f"  {name}: {value!r}" for name, value in results.items()
    )
    if not case.refusal:
        assert kinds == {"text"}
        text = results["library"][1]
        constrained = "stop" in case.fields or "structured_outputs" in case.fields
        assert len(text) == case.fields["max_new_tokens"] or constrained, text


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "constraint", [{"regex": SPEAKER_LINE}, {"grammar": SPEAKER_GRAMMAR}], ids=["regex", "grammar"]
)
def test_a_constrained_request_gets_its_text_alone_and_in_a_batch_of_64(loaded, backend, constraint):
    """63 neighbours in the same batch (constrained by the same constraint, by a regex, a grammar, choices, or not at
    all) change no token of a sampled request constrained by a regex or a grammar."""
    from gpt_serve.generation.scheduler import Scheduler

    m = loaded[backend]
    fields = dict(prompt="ROMEO:\n", temperature=1, seed=21, max_new_tokens=60)
    request = parse_request({**fields, "structured_outputs": constraint})
    others = [
        {"structured_outputs": constraint},
        {"structured_outputs": {"regex": "[a-z ]+"}},
        {"structured_outputs": {"choice": ["Ay.", "No."]}},
        {},
        {"structured_outputs": {"grammar": 'start: ("Ay" | "No") "."'}},
    ]
    alone = generate_text(
        m.backend, m.vocab, "ROMEO:\n", 60, SamplingParams(1.0), seed=21, structured_outputs=constraint
    )
    scheduler = Scheduler(m.backend, max_batch=64, max_queue=64)
    try:
        streams = [
            TextStream(scheduler, m.vocab, parse_request({**fields, **others[i % 5], "seed": 100 + i}))
            for i in range(63)
        ]
        streams.insert(31, TextStream(scheduler, m.vocab, request))
        texts = ["".join(s) for s in streams]
    finally:
        scheduler.close()
    assert texts[31] == alone and streams[31].finish_reason == "stop"
