"""The OpenAI-compatible API's Prometheus metrics, labelled by model and backend, the ones a serving dashboard plots
(vLLM exports the same kinds): time to first token, inter-token latency, end-to-end latency and queue time
(histograms); prompt and generation tokens and requests by finish reason (counters); running and waiting requests
(gauges, read from the schedulers at scrape time). `deploy/grafana-dashboard.json` plots them.
"""

from __future__ import annotations

import time

from .registry import ModelRegistry

PREFIX = "gpt_serve_"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_GAP_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """The metrics of one API (one `create_router`); `observe(text, model, backend)` per request stream."""

    def __init__(self, registry: ModelRegistry):
        from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self._generate = generate_latest
        self.registry = CollectorRegistry()
        labels = ["model", "backend"]

        def histogram(name, doc, buckets):
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=self.registry)

        self.ttft = histogram("time_to_first_token_seconds", "Seconds from arrival to the first token", LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Seconds between two tokens of a stream", TOKEN_GAP_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Seconds from arrival to the last token", LATENCY_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Seconds waiting before a row", LATENCY_BUCKETS)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens", labels, registry=self.registry)
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens", "Generated tokens, as answered", labels, registry=self.registry
        )
        self.finished = Counter(
            PREFIX + "request_success", "Requests finished, by finish reason", [*labels, "finished_reason"],
            registry=self.registry,
        )  # fmt: skip
        models = registry

        class Live:
            def collect(self):
                running = GaugeMetricFamily(PREFIX + "num_requests_running", "Requests decoding now", labels=labels)
                waiting = GaugeMetricFamily(PREFIX + "num_requests_waiting", "Requests queued", labels=labels)
                tokens = CounterMetricFamily(PREFIX + "decoded_tokens", "Tokens the decode loops made", labels=labels)
                for (name, key), scheduler in models.schedulers().items():
                    stats = scheduler.stats()
                    running.add_metric([name, key], stats["active"])
                    waiting.add_metric([name, key], stats["waiting"])
                    tokens.add_metric([name, key], stats["tokens"])
                yield from (running, waiting, tokens)

        self.registry.register(Live())
        self._children: dict[tuple[str, str], tuple] = {}

    def _for(self, model: str, backend: str) -> tuple:
        """The labelled series of (model, backend), looked up once (`labels()` takes a lock and a dict each call)."""
        key = (model, backend)
        if key not in self._children:
            self._children[key] = tuple(
                m.labels(model, backend)
                for m in (self.ttft, self.itl, self.e2e, self.queue, self.prompt_tokens, self.generation_tokens)
            )
        return self._children[key]

    def tokens_arrived(self, stream, model: str, backend: str, before: int, now: float) -> None:
        """A stream's tokens `before..stream.generated` arrived at `now` (perf_counter): the first one's TTFT and
        queue time, and the gaps between tokens (a chunk's gap shared by its tokens)."""
        new = stream.generated - before
        if new <= 0:
            return
        ttft, itl, _, queue, _, _ = self._for(model, backend)
        if before == 0:
            ttft.observe(stream.first_token_at - stream.submitted_at)
            if stream.admitted_at is not None:
                queue.observe(stream.admitted_at - stream.submitted_at)
            new -= 1
            last = stream.first_token_at
        else:
            last = stream.last_seen_at
        stream.last_seen_at = now
        if new > 0:
            gap = max(now - last, 0.0) / new
            for _ in range(new):
                itl.observe(gap)

    def finish(self, model: str, backend: str, prompt_tokens: int, tokens: int, reason: str, submitted_at: float):
        _, _, e2e, _, prompt, generation = self._for(model, backend)
        prompt.inc(prompt_tokens)
        generation.inc(tokens)
        self.finished.labels(model, backend, reason).inc()
        e2e.observe(time.perf_counter() - submitted_at)

    def render(self) -> bytes:
        return self._generate(self.registry)
