"""The OpenAI-compatible API (`gpt_serve.serving.api`) as a Ray Serve application: N replicas behind Ray's HTTP proxy
(needs the `ray` extra: pip install 'gpt-serve[ray]').

    gpt-serve serve --ray --replicas 2 --threads 1     # a local Ray instance, the API on http://127.0.0.1:8000/v1
    serve run deploy/ray-serve.yaml                    # Ray's own CLI, through `build_app` below

Each replica is a Ray actor process that builds its own `ModelRegistry` (its own loaded backends and schedulers)
as it starts, from `RayServeOptions`: plain settings are all the driver sends, nothing loaded is pickled. Ray's
proxy sends a replica at most `max_batch` requests at once (`max_ongoing_requests`), holds up to `max_queue` more
(`max_queued_requests`; past that Ray answers 503) and streams the server-sent chunks as the replica writes them.
Every answer names its replica in an `x-gpt-serve-replica` header.

Ray is imported only here, and only when a function below runs (`from ray import serve` alone takes ~0.7 s).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..extras import missing_extra
from ..generation.backends.loading import check_backend_key
from ..generation.backends.prompt_cache import DEFAULT_PROMPT_CACHE_BYTES
from ..generation.fields import DEFAULT_BACKEND, MAX_NEW_TOKENS
from ..generation.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, DEFAULT_PREEMPT_AFTER
from .registry import ModelRegistry
from .request_caps import MAX_REQUEST_LOGPROBS, MAX_REQUEST_TOKENS, RequestCaps
from .server_limits import BODY_TIMEOUT, MAX_BODY_BYTES, ServerLimits

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fastapi import FastAPI
    from ray.serve import Application

APP_NAME = "gpt-serve"


class RayServeOptions(BaseModel):
    """How many replicas, what each may use and what each serves: the `gpt-serve serve --ray` options of the same
    names, and the `args` of a `serve run` config. Paths are read on each replica's machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replicas: int = Field(1, ge=1, description="replicas of the API, each with its own models and decode loops")
    replica_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each replica (num_cpus)")
    threads: int | None = Field(None, ge=1, description="threads per forward pass (None: replica_cpus, at least 1)")
    models: tuple[str, ...] = Field(
        (), description="shipped model names or model folders, the first the default (none: shakespeare)"
    )
    served_model_names: tuple[str, ...] | None = Field(None, description="the name each of `models` is served as")
    models_root: str | None = Field(None, description="serve every model folder under this folder too")
    model_dirs: tuple[str, ...] = Field((), description="more models after `models`: NAME=PATH or PATH")
    backend: str = Field(DEFAULT_BACKEND, description="the backend of a request that names none")
    max_batch: int = Field(
        DEFAULT_MAX_BATCH, ge=1, description="requests each replica runs at once, over all its models"
    )
    max_queue: int = Field(DEFAULT_MAX_QUEUE, ge=1, description="requests Ray's proxy holds when every replica is full")
    max_tokens_limit: int = Field(
        MAX_NEW_TOKENS, ge=1, le=MAX_NEW_TOKENS, description="the largest max_tokens accepted"
    )
    preempt_after: int | None = Field(
        DEFAULT_PREEMPT_AFTER,
        ge=1,
        description="tokens a row makes before it yields to a waiting request (None: never)",
    )
    prompt_cache_bytes: int = Field(
        DEFAULT_PROMPT_CACHE_BYTES, ge=0, description="what each loaded model keeps of the prompts it prefilled"
    )
    max_request_tokens: int = Field(MAX_REQUEST_TOKENS, ge=1, description="choices x max_tokens of one request")
    max_request_logprobs: int = Field(MAX_REQUEST_LOGPROBS, ge=1, description="logprob entries of one request")
    max_body_bytes: int = Field(MAX_BODY_BYTES, ge=1, description="the largest request body accepted (413 past it)")
    body_timeout: float = Field(BODY_TIMEOUT, gt=0, description="seconds a request body may take to arrive (408)")
    generation_config: Literal["auto", "vllm"] = Field(
        "auto", description="a request's defaults: its model folder's generation_config.json, or the built-in ones"
    )
    preload: bool = Field(True, description="each replica loads and warms up the default model for `backend` first")
    api_key: str | None = Field(None, description="every route but /health needs 'Authorization: Bearer <key>'")
    metrics_need_key: bool = Field(False, description="/metrics needs the API key too")
    allow_origins: tuple[str, ...] = Field((), description="browser origins allowed to call the API (CORS)")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        return check_backend_key(value)

    @property
    def replica_threads(self) -> int:
        return self.threads or max(1, int(self.replica_cpus))

    def registry(self) -> ModelRegistry:
        """One replica's models (nothing loaded yet): `ModelRegistry.serving`; ValueError for a missing one."""
        return ModelRegistry.serving(
            (*self.models, *self.model_dirs), self.served_model_names, self.models_root, threads=self.replica_threads,
            max_batch=self.max_batch, max_queue=self.max_queue,
            generation_config=self.generation_config, preempt_after=self.preempt_after,
            prompt_cache_bytes=self.prompt_cache_bytes,
        )  # fmt: skip


def require_ray():
    """(ray, ray.serve); a `MissingDependency` naming the `ray` extra when Ray Serve is not installed."""
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise missing_extra("Ray Serve", "ray", e) from None
    return ray, serve


def replica_app(options: RayServeOptions, replica_id: str) -> FastAPI:
    """One replica's API, over a registry of its own (this runs in the replica's process)."""
    from .api import create_app

    registry, limit = options.registry(), options.max_tokens_limit
    if options.preload:
        loaded, line = registry.preload(options.backend)
        (logger.info if loaded else logger.warning)("replica %s: %s", replica_id, line)
    access = dict(
        api_key=options.api_key, metrics_need_key=options.metrics_need_key, allow_origins=options.allow_origins
    )
    limits = ServerLimits(max_body_bytes=options.max_body_bytes, body_timeout=options.body_timeout)
    caps = RequestCaps(options.max_request_tokens, options.max_request_logprobs)
    return create_app(
        registry, replica_id=replica_id, default_backend=options.backend, max_tokens_limit=limit, limits=limits,
        caps=caps, **access,
    )  # fmt: skip


def application(options: RayServeOptions) -> Application:
    """The Ray Serve application of `options.replicas` replicas of the API (`serve.run(application(options))`)."""
    _, serve = require_ray()

    def build_replica_app() -> FastAPI:  # Ray runs this in each replica as it starts: only `options` travels
        from ray import serve

        if os.environ.get(LOOPBACK_ONLY_ENV) == "0":
            _replica_grpc_on_loopback()
        return replica_app(options, serve.get_replica_context().replica_tag)

    deployment = serve.deployment(
        serve.ingress(build_replica_app)(),
        name=APP_NAME,
        num_replicas=options.replicas,
        ray_actor_options={"num_cpus": options.replica_cpus},
        max_ongoing_requests=options.max_batch,
        max_queued_requests=options.max_queue,
    )
    return deployment.bind()


def build_app(args: dict[str, Any]) -> Application:
    """The application builder that Ray's `serve run` calls: `serve run gpt_serve.serving.ray_serve:build_app
    replicas=2`,
    or a config file's `import_path` (deploy/ray-serve.yaml). `args` are `RayServeOptions` fields."""
    return application(RayServeOptions.model_validate(args))


# Ray Serve kills a proxy that is not ready within 5 s of its start, or that misses health checks of 10 s: on a
# small machine beside busy processes, a proxy starting up took longer and was killed ("unhealthy", then
# `serve.start` failed). Patient defaults; set these variables to override them.
PATIENT_PROXY = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
}


@contextlib.contextmanager
def serving(
    options: RayServeOptions,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    log_level: str = "info",
) -> Iterator[str]:
    """Deploys the application and yields the API's base URL; takes it down on exit.

    `address` None starts a new local Ray instance (without Ray's dashboard), stopped on exit. Otherwise the Ray
    cluster at `address` is joined (`"auto"`: the one this machine belongs to) and on exit only this application
    is deleted from it. Serve's proxy listens on `host:port` (a cluster already running Serve keeps its own).
    `log_level` is that of the replicas' logs (one line per request at "info")."""
    ray, serve = require_ray()
    local = address is None
    for name, seconds in PATIENT_PROXY.items():  # read by Serve's controller, a process ray.init starts from here
        os.environ.setdefault(name, seconds)
    if local:
        if _is_loopback(host):
            _keep_ray_on_loopback(ray)
        ray.init(address="local", include_dashboard=False)
    else:
        ray.init(address=address)
    try:
        if local:
            check_cpus(ray.cluster_resources().get("CPU", 0.0), options)
        serve.start(http_options={"host": host, "port": port})
        logging_config = {"log_level": log_level.upper()}
        try:
            serve.run(application(options), name=APP_NAME, route_prefix="/", logging_config=logging_config)
        except Exception as e:  # a replica that cannot start (models missing on a node, a bad option): say so
            raise ValueError(f"Ray Serve could not deploy {APP_NAME}: {type(e).__name__}: {str(e)[:500]}") from None
        yield _root_url(serve, f"http://{host}:{port}")
    finally:
        if local:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
        ray.shutdown()


LOOPBACK_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _keep_ray_on_loopback(ray) -> None:
    """Makes a local Ray instance bind its own services to 127.0.0.1 (its GCS, raylet, workers' and agents' gRPC and
    metrics ports), as Serve's proxy is for `--host 127.0.0.1`. Ray 2.60 binds each to every interface unless the
    node's address is the loopback one, and it takes the loopback as the node's address only where its clusters are
    off (its default on macOS and Windows): `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read by the processes Ray starts
    (they inherit the environment) and, at its import, by this one (hence the constant too)."""
    os.environ[LOOPBACK_ONLY_ENV] = "0"
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False


def _replica_grpc_on_loopback() -> None:
    """In a replica of a loopback-only instance (`_keep_ray_on_loopback`): Ray Serve 2.60 starts each replica's
    inter-deployment gRPC server on `[::]:0`, every interface, with no option; this binds it to 127.0.0.1, the
    node's address. (Called as the replica builds its app, before Serve starts that server.)"""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server
    replica.add_port_to_grpc_server = lambda server, address: bind(server, address.replace("[::]", "127.0.0.1"))


def _root_url(serve, asked: str) -> str:
    """Where Serve's proxy listens: a cluster already running Serve keeps its own HTTP options (Ray then logs a
    warning and "Application ... is ready at" the real address, which its client knows; not a public API)."""
    try:
        return serve.context._get_global_client().root_url.rstrip("/")
    except AttributeError:
        return asked


def check_cpus(available: float, options: RayServeOptions) -> None:
    """ValueError, saying what to change, when the replicas ask for more CPUs than a local Ray instance has."""
    needed = options.replicas * options.replica_cpus
    if needed > available:
        raise ValueError(
            f"{options.replicas} replicas at {options.replica_cpus:g} CPU each need {needed:g} CPUs but the local "
            f"Ray instance has {available:g}: lower --replicas or --replica-cpus (a fraction such as 0.5 is allowed), "
            "or join a larger cluster with --ray-address"
        )
