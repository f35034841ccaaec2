"""A worker's own Prometheus metrics (``electric worker --metrics``; docs/operations.md).

Off unless asked: a ``Worker`` without ``metrics`` pays one ``is None`` test per write. With
them, each counter is fed where the fact is known, in one place each:

- runs and signal outcomes from the host's fenced writes (``Fenced``): a run counts as
  started when its STARTED record applied, and as ended, with the status of its last
  record, when that record is sent; a signal's outcome when the record that carries it
  is sent (alone, or settled with a transition). Counted before sending, so whoever
  sees a record in the stream finds it counted; a record the server then refuses (the
  lease was lost meanwhile) stays counted;
- signals delivered, as deliveries arrive; ``on_signal`` latency around the call
  (``EntityHost``); reconnects at each welcome after the first;
- leases held and the session read from the worker when scraped (``_Live``).

Each worker has its own ``CollectorRegistry``, never the process's default one. Labels
are bounded: entity types are the app's own, signals, outcomes and run statuses enums.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .._proto.electric.v1 import runtime_service_pb2 as rt
from .._proto.electric.v1 import types_pb2 as pb
from .._wire.enums import RUN_STATUS_NAMES, outcome_from_pb, signal_from_pb
from ..lifecycle import Outcome, Signal

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .worker import Worker

__all__ = ["MetricsServer", "WorkerMetrics"]

# From a quick tool call to an agent's hour-long task.
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# A handler should return within its grace (30 s by default); past that it is news.
HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)
_ENDS = frozenset(
    {pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED, pb.RUN_STATUS_ABORTED, pb.RUN_STATUS_INPUT_REQUIRED}
)


class WorkerMetrics:
    """One worker's metrics; ``Worker(metrics=WorkerMetrics())`` feeds them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.runs_started = Counter(
            "electric_worker_runs_started",
            "Runs whose STARTED record this worker wrote, by entity type.",
            ["type"],
            registry=self.registry,
        )
        self.runs_ended = Counter(
            "electric_worker_runs_ended",
            "Runs this worker recorded as ended, by entity type and outcome (completed, failed, aborted).",
            ["type", "outcome"],
            registry=self.registry,
        )
        self.run_seconds = Histogram(
            "electric_worker_run_seconds",
            "From a run's STARTED record to its last one, by entity type.",
            ["type"],
            buckets=RUN_BUCKETS,
            registry=self.registry,
        )
        self.signals_delivered = Counter(
            "electric_worker_signals_delivered",
            "Signals delivered to this worker's entities, by signal.",
            ["signal"],
            registry=self.registry,
        )
        self.signal_outcomes = Counter(
            "electric_worker_signal_outcomes",
            "Signal outcomes this worker recorded or carried out (a SIGINT the server settled "
            "aborted in its own commit counts once its run is cancelled here), by signal and outcome.",
            ["signal", "outcome"],
            registry=self.registry,
        )
        self.handler_seconds = Histogram(
            "electric_worker_handler_seconds",
            "How long each on_signal call took, by signal and result (returned, failed, cancelled).",
            ["signal", "result"],
            buckets=HANDLER_BUCKETS,
            registry=self.registry,
        )
        self.reconnects = Counter(
            "electric_worker_reconnects",
            "Sessions the server welcomed after the worker's first one.",
            registry=self.registry,
        )
        # When each run in progress started (perf_counter), by (type, id, message offset).
        self._started: dict[tuple[str, str, int], float] = {}
        # Each label set's child, made once: a run then costs dict lookups and increments, not
        # prometheus-client's label validation and lock on every record.
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def follow(self, worker: Worker) -> None:
        """Report ``worker``'s leases and session when scraped."""
        self.registry.register(_Live(worker))

    def delivered(self, event: pb.Event) -> None:
        if event.WhichOneof("value") == "signal":
            self._child(self.signals_delivered, signal_from_pb(event.signal.signal).value).inc()

    def handler_returned(self, signal: Signal, seconds: float, result: str) -> None:
        self._child(self.handler_seconds, signal.value, result).observe(seconds)

    def session_lost(self) -> None:
        """Runs in progress end unrecorded with their session: they are not counted as ended."""
        self._started.clear()

    def run_started(self, ref: pb.EntityRef, message_offset: int) -> None:
        """A run's STARTED record applied: the run begins."""
        self._child(self.runs_started, ref.type).inc()
        self._started[ref.type, ref.id, message_offset] = time.perf_counter()

    def recording(self, ref: pb.EntityRef, op: dict[str, Any]) -> None:
        """A record the worker is about to write (``RuntimeWrite`` fields): counted before it is
        sent, so whoever sees the record in the stream finds it counted."""
        if (run := op.get("run")) is not None:
            if run.status in _ENDS:
                self._child(self.runs_ended, ref.type, RUN_STATUS_NAMES[run.status]).inc()
                started = self._started.pop((ref.type, ref.id, run.message_offset), None)
                if started is not None:  # else it was cancelled before it started
                    self._child(self.run_seconds, ref.type).observe(time.perf_counter() - started)
        elif (update := op.get("signal_outcome")) is not None:
            self._outcome(update)
        elif (transition := op.get("transition")) is not None:
            for settled in transition.outcomes:
                self._outcome(settled)

    def carried_out(self, signal: Signal, outcome: Outcome) -> None:
        """A signal's outcome the server recorded, which this worker then carried out."""
        self._child(self.signal_outcomes, signal.value, outcome.value).inc()

    def _outcome(self, update: rt.SignalOutcomeUpdate) -> None:
        outcome = outcome_from_pb(update.outcome)
        if outcome is not None:
            self._child(self.signal_outcomes, signal_from_pb(update.signal).value, outcome.value).inc()


class _Live(Collector):
    """Gauges read from the worker at each scrape (from the metrics server's thread: each reads
    one attribute, which the GIL keeps whole)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "electric_worker_leases_held", "Entities this worker hosts now.", value=len(self.worker.hosts)
        )
        yield GaugeMetricFamily(
            "electric_worker_connected",
            "1 while the worker has a session the server welcomed, else 0.",
            value=int(self.worker.connected.is_set()),
        )


class MetricsServer:
    """``GET /metrics`` for one registry, served by prometheus_client's own small HTTP server on a
    daemon thread: it costs the event loop nothing, and a scrape never waits on a busy loop."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        server: WSGIServer
        server, self._thread = start_http_server(port, host, registry)
        self._server = server
        self.port: int = server.server_port
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
