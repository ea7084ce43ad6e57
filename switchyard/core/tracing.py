"""Optional OpenTelemetry traces: one span per API request, with children for the classifier's
decision, each cascade rung and each backend attempt; W3C `traceparent` sent to upstreams.

Off (no `tracing.otlp_endpoint`, the default): `build_tracing` returns None, no SDK provider is
built, and every helper here costs one context-variable read. On: the proxy makes the app's tracer
current for the duration of a request (`request_span`), continuing the trace of a client that sent
a `traceparent`; code below the proxy opens children with `child_span` and backends add
`traceparent_headers()` to what they send upstream.

Span attributes carry ids, names and statuses only: never prompt text, never a key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from switchyard.core.settings import TracingSettings

__all__ = [
    "SpanExporter",
    "Tracing",
    "annotate_request",
    "build_tracing",
    "child_span",
    "request_span",
    "traceparent_headers",
]

_current_tracer: ContextVar[Tracer | None] = ContextVar("switchyard_tracer", default=None)
_request_span: ContextVar[Span | None] = ContextVar("switchyard_request_span", default=None)
_W3C = TraceContextTextMapPropagator()
Attribute = str | bool | int | float


class Tracing:
    """An app's tracer and the provider behind it; `shutdown()` flushes the spans not yet sent."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("switchyard")

    def shutdown(self) -> None:
        self.provider.shutdown()


def build_tracing(settings: TracingSettings, exporter: SpanExporter | None = None) -> Tracing | None:
    """The app's tracing, or None when it is off. `exporter` replaces the OTLP one (and turns
    tracing on without an endpoint): spans go to it as each ends."""
    if exporter is None:
        if settings.otlp_endpoint is None:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: SimpleSpanProcessor | BatchSpanProcessor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.otlp_endpoint)
        )
    else:
        processor = SimpleSpanProcessor(exporter)
    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}),
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
    )
    provider.add_span_processor(processor)
    return Tracing(provider)


@contextmanager
def request_span(tracing: Tracing, name: str, headers: Mapping[str, str]) -> Iterator[Span]:
    """The request's span, current while the request runs: a child of the client's `traceparent`
    (in `headers`, lower-case names) if it sent a valid one, else the root of a new trace."""
    token = _current_tracer.set(tracing.tracer)
    try:
        parent = _W3C.extract(dict(headers))
        with tracing.tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER) as span:
            span_token = _request_span.set(span)
            try:
                yield span
            finally:
                _request_span.reset(span_token)
    finally:
        _current_tracer.reset(token)


_NO_SPAN: AbstractContextManager[None] = nullcontext()


def child_span(name: str, **attributes: Attribute | None) -> AbstractContextManager[Span | None]:
    """A child of the current span while tracing is on; None (and nothing recorded) when it is off
    (one shared `nullcontext`: this runs for every attempt)."""
    tracer = _current_tracer.get()
    if tracer is None:
        return _NO_SPAN
    values = {f"switchyard.{key}": value for key, value in attributes.items() if value is not None}
    return tracer.start_as_current_span(name, attributes=values)


def traceparent_headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`, if any) for an upstream request: empty when tracing is off."""
    if _current_tracer.get() is None:
        return {}
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier


def annotate_request(**attributes: Attribute | None) -> None:
    """Attributes of the request's own span (`switchyard.<name>`), from wherever they become known."""
    span = _request_span.get()
    if span is not None:
        span.set_attributes({f"switchyard.{key}": value for key, value in attributes.items() if value is not None})
