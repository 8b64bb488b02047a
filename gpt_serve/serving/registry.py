"""A server's models: which names exist, where their folders are, each backend loaded once and shared.

The demo and the OpenAI-compatible API (`gpt_serve.serving.api`) serve through one `ModelRegistry`.

A `ModelRegistry` maps model names to folders (or to None: a model the demo expects, such as a ladder stage that
has not been trained yet, so the UI can list it and say why it is missing). Nothing is loaded until asked for;
then every (model, backend) pair is loaded exactly once, under a lock, by the library's loader
(`gpt_serve.generation.load_backend`, which checks the folder), and gets one `Scheduler`
(`gpt_serve.generation.scheduler`): a single decode loop that runs every request for that pair as one batch.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..chargpt.chat_format import ChatFormat, read_chat_format
from ..folders.corpus_record import CorpusRecord, corpus_record_or_none
from ..generation.backends.loading import LoadedModel, check_backend_key, load_backend
from ..generation.backends.prompt_cache import DEFAULT_PROMPT_CACHE_BYTES, check_max_bytes
from ..generation.fields import BACKENDS, RequestError, show_value
from ..generation.folder_defaults import check_mode, read_generation_defaults
from ..generation.model_folder import ModelFolder
from ..generation.requests import Request
from ..generation.runner import torch_runner
from ..generation.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, DEFAULT_PREEMPT_AFTER, Scheduler
from ..models import DEFAULT_MODEL, LADDER, MODELS_DIR, discover, is_model_folder, model_path
from ..onnx_contract import onnx_path

logger = logging.getLogger(__name__)

LADDER_MODELS = tuple(LADDER)
EXPECTED_MODELS = (DEFAULT_MODEL, *LADDER_MODELS)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelUnavailable(RequestError):
    """The model or backend exists as a choice but cannot be served (not trained, not exported, not installed)."""


def parse_model_dir(spec: str) -> tuple[str, Path]:
    """`NAME=PATH` or `PATH` (named after the folder) -> (name, folder), checking the folder holds a model."""
    name, sep, path = spec.partition("=")
    if not sep or not _NAME_RE.match(name):
        name, path = Path(spec).name, spec
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ValueError(f"--model-dir {spec!r}: the folder {folder} does not exist")
    if not is_model_folder(folder):
        raise ValueError(f"--model-dir {spec!r}: {folder} is not a model folder (no config.json in it)")
    if not _NAME_RE.match(name):
        raise ValueError(f"--model-dir {spec!r}: cannot name a model {name!r}; write NAME=PATH")
    return name, folder


def model_folders(models: Iterable[str], served_names: Sequence[str] | None = None) -> dict[str, Path]:
    """What a server is asked to serve, in order: each of `models` a shipped model's name, a model folder (named after
    it) or `NAME=PATH` (`parse_model_dir`), each renamed by `served_names` (`--served-model-name`: one per model)."""
    models = list(models)
    if served_names is not None and len(served_names) != len(models):
        raise ValueError(
            f"--served-model-name gives one name per model: {len(models)} model(s) {models}, "
            f"{len(served_names)} name(s) {list(served_names)}"
        )
    folders: dict[str, Path] = {}
    for i, spec in enumerate(models):
        if "=" in spec and _NAME_RE.match(spec.partition("=")[0]):
            name, folder = parse_model_dir(spec)
        else:
            folder = model_path(spec)  # a shipped name or a folder; a clear error for a missing one
            name = folder.resolve().name  # a shipped model's name is its folder's
        name = served_names[i] if served_names is not None else name
        if not _NAME_RE.match(name):
            raise ValueError(f"cannot serve a model as {name!r}: a name is letters, digits, '.', '_' and '-'")
        if name in folders:
            raise ValueError(f"two models are served as {name!r}: give each its own --served-model-name")
        folders[name] = folder
    return folders


def _models_under(root: Path) -> dict[str, Path]:
    """`gpt_serve.models.discover(root)`, its error naming the flag."""
    try:
        return discover(root)
    except ValueError:
        raise ValueError(f"--models-root {root} is not a directory") from None


def _last_val_loss(path: Path) -> float | None:
    """The last `val_loss` in a training metrics file (one JSON object per line), or None."""
    if not path.is_file():
        return None
    loss = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("val_loss"), (int, float)):
                loss = float(record["val_loss"])
    return loss


def _runner(backend: str):
    """The runner a backend's models load and decode on: the shared `torch_runner()` for PyTorch (see
    `runner.Runner`), None for ONNX Runtime (loaded by the caller; each scheduler gets a thread of its own)."""
    return torch_runner() if backend == "torch" else None


class ModelRegistry:
    """Model names -> folders, and the loaded backends, shared.

    Args:
        folders: name -> model folder, or None for a model the demo lists but does not have.
        threads: intra-op threads of each ONNX Runtime session (None: ONNX Runtime's default). PyTorch's thread
            count is process-wide; the application sets it (`torch.set_num_threads`).
        models_root: where models named without a folder were looked for (for error messages).
        max_batch: the most requests each (model, backend) decodes at once; `max_queue`: the most waiting.
        generation_config: "auto": a request's defaults are its model folder's `generation_config.json`
            (`gpt_serve.generation.folder_defaults`); "vllm": the request specification's own.
        default: the default model (`default_model`; None: the shipped default if present, else the first).
        preempt_after: the tokens a row makes before it yields to a waiting request (None: never; `Scheduler`).
        prompt_cache_bytes: what each loaded backend keeps of the prompts it prefilled (`load_backend`; 0: none).
    """

    def __init__(
        self,
        folders: Mapping[str, str | Path | None],
        threads: int | None = 1,
        models_root: str | Path = MODELS_DIR,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_queue: int = DEFAULT_MAX_QUEUE,
        generation_config: str = "auto",
        default: str | None = None,
        preempt_after: int | None = DEFAULT_PREEMPT_AFTER,
        prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
    ):
        if not folders:
            raise ValueError("a ModelRegistry needs at least one model name")
        if default is not None and default not in folders:
            raise ValueError(f"the default model {default!r} is not one of {list(folders)}")
        self.default = default
        self.folders = {name: (Path(f) if f is not None else None) for name, f in folders.items()}
        self.threads = threads
        self.models_root = Path(models_root)  # where a missing named model was looked for
        self.max_batch, self.max_queue, self.preempt_after = max_batch, max_queue, preempt_after
        self.prompt_cache_bytes = check_max_bytes(prompt_cache_bytes)  # before any model loads
        self.generation_config = check_mode(generation_config)
        self._folder_records: dict[tuple[str, str], Any] = {}  # (model, what) -> its ModelFolder, defaults, chat
        self._loaded: dict[tuple[str, str], Any] = {}
        self._schedulers: dict[tuple[str, str], Scheduler] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @classmethod
    def discover(
        cls,
        model_dirs: Iterable[str] = (),
        models_root: str | Path | None = MODELS_DIR,
        expected: Iterable[str] = EXPECTED_MODELS,
        threads: int | None = 1,
        **options,
    ) -> ModelRegistry:
        """The models under `models_root` (`gpt_serve.models.discover`), then `expected` names that are missing
        (listed as unavailable), then the `model_dirs` (`NAME=PATH` or `PATH`), which win on a name clash."""
        root = Path(models_root) if models_root is not None else None
        folders: dict[str, Path | None] = {**_models_under(root)} if root is not None else {}
        for name in expected:
            folders.setdefault(name, None)
        for spec in model_dirs:
            name, folder = parse_model_dir(spec)
            folders[name] = folder
        order = {name: i for i, name in enumerate(EXPECTED_MODELS)}
        names = sorted(folders, key=lambda n: (order.get(n, len(order)), n))
        return cls({n: folders[n] for n in names}, threads=threads, models_root=root or MODELS_DIR, **options)

    @classmethod
    def serving(
        cls,
        models: Iterable[str] = (),
        served_names: Sequence[str] | None = None,
        models_root: str | Path | None = None,
        threads: int | None = 1,
        **options,
    ) -> ModelRegistry:
        """What `gpt-serve serve MODEL ...` serves: the models under `models_root` when given, then `models`
        (`model_folders`), which win on a name clash; the shipped default alone when neither names any. The first
        of `models` is the default model."""
        named = model_folders(models, served_names)
        if models_root is None:
            folders = named or {DEFAULT_MODEL: MODELS_DIR / DEFAULT_MODEL}
            return cls(folders, threads=threads, default=next(iter(folders)), **options)
        folders = {**_models_under(Path(models_root)), **named}
        if not folders:
            raise ValueError(f"no model folder found under {models_root} (--models-root)")
        return cls(folders, threads=threads, models_root=models_root, default=next(iter(named), None), **options)

    # ---- names and availability (never loads anything) ----

    @property
    def names(self) -> list[str]:
        return list(self.folders)

    @property
    def available(self) -> list[str]:
        return [n for n, f in self.folders.items() if f is not None and is_model_folder(f)]

    def default_model(self, preferred: str | None = None) -> str:
        """`preferred` if given, else the shipped default if present, else the first model present."""
        if preferred is not None:
            self.folder(preferred)  # raises a clear error for an unknown or missing name
            return preferred
        if self.default is not None:
            return self.default
        if DEFAULT_MODEL in self.available:
            return DEFAULT_MODEL
        return (self.available or self.names)[0]

    def resolve_model(self, name: Any) -> str:
        if not isinstance(name, str) or name.strip() not in self.folders:
            raise RequestError(f"unknown model {show_value(name)}: choose one of {self.names}", "model")
        return name.strip()

    def folder(self, name: Any) -> Path:
        """The folder of a model; RequestError for an unknown name, ModelUnavailable for a missing folder."""
        name = self.resolve_model(name)
        folder = self.folders[name]
        if folder is None or not is_model_folder(folder):
            where = folder if folder is not None else self.models_root / name
            hint = " (the ladder models are trained by `python -m training.ladder`)" if name in LADDER_MODELS else ""
            raise ModelUnavailable(
                f"model {name!r} is not available on this server: no model folder at {where}{hint}. "
                f"Available: {self.available or 'none'}"
            )
        return folder

    def unavailable_reason(self, name: str, backend: str) -> str | None:
        """Why (model, backend) cannot be served, or None if it looks servable; cheap (file checks only)."""
        try:
            folder = self.folder(name)
            key = check_backend_key(backend)
        except ValueError as e:
            return str(e)
        if key != "torch":
            try:
                from ..generation.backends.onnx_backend import OnnxBackend  # noqa: F401  (is onnxruntime installed?)
            except ImportError as e:
                return (
                    f"{BACKENDS[key]} is not available on this server: cannot import "
                    f"gpt_serve.generation.backends.onnx_backend ({e}); "
                    "install onnxruntime (pip install 'gpt-serve[onnx]')"
                )
            path = onnx_path(folder, quantized=key == "onnx-int8")
            if not path.is_file():
                return (
                    f"{BACKENDS[key]} is not available for model {name!r}: {path} is missing; "
                    f"export it with `python -m export {folder}`"
                )
        return None

    def model_folder(self, name: str) -> ModelFolder:
        """The model's folder, read and checked once (`ModelFolder.open`) and shared by its backends and the
        surfaces; ModelUnavailable naming the file and what is wrong."""
        return self._folder_record(name, "folder", ModelFolder.open)

    def info(self, name: str) -> dict[str, Any]:
        """What the UI shows about a model: its architecture (config.json) and, when the training wrote
        `metrics.jsonl`, its last validation loss (`val_loss`, None otherwise)."""
        folder = self.model_folder(name)
        keys = ("block_size", "n_embd", "n_head", "n_layer", "vocab_size")
        return {**{k: folder.config.get(k) for k in keys}, "val_loss": _last_val_loss(folder.path / "metrics.jsonl")}

    def corpus(self, name: str) -> CorpusRecord | None:
        """What the model folder records of its training text (`corpus.json`), for the surfaces that present it;
        None when it records none, or when its record cannot be read (logged: the model is still served)."""
        try:
            folder = self.folder(name)
        except RequestError:
            return None
        return corpus_record_or_none(folder)

    def vocab_sha256(self, name: str) -> str | None:
        """The hash of the model's vocabulary (`vocab.json`): models with the same one read a prompt the same way.
        None when the model is missing or its folder fails its checks (its requests say why)."""
        try:
            return self.model_folder(name).vocab.sha256
        except RequestError:
            return None

    def generation_defaults(self, name: str) -> dict[str, Any]:
        """The defaults of a request for `name` that names none (its folder's generation config, see
        `generation_config`); ModelUnavailable naming the file and field of a bad value."""
        return self._folder_record(name, "defaults", lambda f: read_generation_defaults(f, self.generation_config))

    def chat_format(self, name: str) -> ChatFormat | None:
        """The model's chat format (`gpt_serve.chargpt.chat_format.read_chat_format`; None: it has none);
        ModelUnavailable naming the file of a bad one."""
        chars = self.model_folder(name).vocab.chars
        return self._folder_record(name, "chat", lambda f: read_chat_format(f, chars))

    def _folder_record(self, name: str, what: str, read) -> Any:
        key = (name, what)
        if key not in self._folder_records:  # read once: a folder's files do not change under a server
            folder = self.folder(name)
            try:
                self._folder_records[key] = read(folder)
            except (OSError, ValueError) as e:
                raise ModelUnavailable(f"model {name!r} cannot be served: {e}") from None
        return self._folder_records[key]

    # ---- loading (once per key, shared) ----

    def backend(self, name: str, backend: str) -> LoadedModel:
        """The shared backend for (model, backend), loaded on first use; ModelUnavailable when it cannot be."""
        key = (name, check_backend_key(backend))
        if key in self._loaded:  # the hot path: no file checks per request
            return self._loaded[key]
        reason = self.unavailable_reason(*key)
        if reason:
            raise ModelUnavailable(reason)
        folder = self.model_folder(name)
        self.generation_defaults(name)  # a bad generation config is refused at load, named
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._loaded:
                try:
                    runner = _runner(key[1])
                    if runner is not None:  # loaded on the thread that will decode it (see `runner.Runner`)
                        loaded = runner.call(load_backend, folder, key[1], self.threads, self.prompt_cache_bytes)
                    else:
                        loaded = load_backend(folder, key[1], self.threads, self.prompt_cache_bytes)
                except (OSError, ValueError) as e:
                    raise ModelUnavailable(f"{BACKENDS[key[1]]} cannot serve model {name!r}: {e}") from None
                logger.info("loaded %s/%s in %.2f s", *key, loaded.load_seconds)
                self._loaded[key] = loaded
            return self._loaded[key]

    def scheduler(self, name: str, backend: str) -> Scheduler:
        """The shared decode loop of (model, backend), started on first use (loading the backend)."""
        key = (name, check_backend_key(backend))
        scheduler = self._schedulers.get(key)
        if scheduler is None or scheduler.closed:  # a closed one (its runner was stopped): a new loop
            loaded = self.backend(*key)
            with self._locks_lock:
                if key not in self._schedulers or self._schedulers[key].closed:
                    runner = _runner(key[1])
                    self._schedulers[key] = Scheduler(
                        loaded.backend, self.max_batch, self.max_queue, runner=runner, preempt_after=self.preempt_after
                    )
                scheduler = self._schedulers[key]
        return scheduler

    def warm_up(self, name: str, backend: str) -> float:
        """Loads (model, backend) and runs a few tokens through its decode loop (first calls allocate; the loop's
        thread is the one that runs the backend), so that a server's first request does not pay for it. Returns the
        seconds it took; ModelUnavailable (a ValueError naming the problem) when the model cannot be served."""
        start = time.perf_counter()
        list(self.scheduler(name, backend).submit(Request([0], 8, seed=0)))
        return time.perf_counter() - start

    def preload(self, backend: str, model: str | None = None) -> tuple[bool, str]:
        """Warms up `model` (default: the default model) for `backend` (`warm_up`), as a server does before it says
        it is ready. Returns whether it did, and a line saying what it did or why that model cannot be served
        (missing or broken files, a runtime that is not installed): the server then serves the others, and
        requests for it get that reason."""
        model = self.default_model() if model is None else model
        reason = self.unavailable_reason(model, backend)
        if reason:
            return False, f"{model}/{backend} not preloaded: {reason}"
        try:
            return True, f"{model}/{backend} loaded and warmed up in {self.warm_up(model, backend):.2f} s"
        except (ModelUnavailable, ImportError) as e:
            return False, f"{model}/{backend} not preloaded: {e}"

    def schedulers(self) -> dict[tuple[str, str], Scheduler]:
        """The decode loops started so far, by (model, backend key)."""
        with self._locks_lock:
            return dict(self._schedulers)

    def close(self) -> None:
        """Stops the decode loops (requests still running end with an error)."""
        with self._locks_lock:
            schedulers, self._schedulers = list(self._schedulers.values()), {}
        for scheduler in schedulers:
            scheduler.close()

    def is_loaded(self, name: str, backend: str) -> bool:
        return (name, check_backend_key(backend)) in self._loaded
