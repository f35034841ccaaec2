"""The server's Prometheus metrics (docs/operations.md), in a registry of its own.

Each server has its own ``CollectorRegistry``, never the process's default one:
tests and notebooks start many servers in one process. Two kinds of metric:

- counted as things happen: once per committed batch, by the store's batch
  listener on its ``Hub`` (writes, batches, commit latency, signals by
  outcome, exec receipts by action and disposition); once per signal refused;
  once per grace expiry (its lateness). A write's path gains no more than a
  counter's increment;
- read from the live objects when scraped (``_Live``): watch streams, worker
  sessions, leases, grace deadlines. They cost nothing between scrapes.

Labels are bounded: signals and outcomes are enums; entity types and code
versions are the most common ``TOP_TYPES`` and ``TOP_CODE_VERSIONS``, the rest
summed as ``_other`` (``other`` may be a real type's name); never an entity id.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from electric_sdk._proto.electric.v1 import types_pb2 as pb
from electric_sdk._wire.enums import EXEC_ACTION_NAMES, EXEC_DISPOSITION_NAMES
from electric_sdk.lifecycle import Signal

from .core.entity_writes import Signalled
from .runtime.writes import RUNTIME_WRITE
from .store.base import Commit, Store

if TYPE_CHECKING:
    from .core.reaper import Reaper
    from .core.watch import Watches
    from .runtime.hosting import Runtime

TOP_TYPES = 20
TOP_CODE_VERSIONS = 5
OTHER = "_other"
# From a page-cache commit (well under a millisecond) to a slow disk's or a remote database's.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# An expiry is due at its deadline; past a second late (a retry after a refused write is one) it
# is news, and an exec entity may wait its settle (a second by default) for its process's exit.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
REJECTED = "rejected"


class ServerMetrics:
    """One server's metrics; ``render`` is what ``GET /metrics`` serves."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        self.signals = Counter(
            "electric_signals",
            "Signals judged, by signal and outcome (rejected: refused, nothing written).",
            ["signal", "outcome"],
            registry=self.registry,
        )
        self.writes = Counter(
            "electric_store_writes",
            "Writes in committed batches (refused and replayed ones included).",
            registry=self.registry,
        )
        self.batches = Counter(
            "electric_store_commit_batches", "Batches the store committed.", registry=self.registry
        )
        self.commit_seconds = Histogram(
            "electric_store_commit_seconds",
            "From a batch's commit starting to the store acknowledging it (sync included).",
            buckets=COMMIT_BUCKETS,
            registry=self.registry,
        )
        self.exec_actions = Counter(
            "electric_exec_actions",
            "Exec receipts workers recorded, by action and disposition.",
            ["action", "disposition"],
            registry=self.registry,
        )
        self.reaper_lateness = Histogram(
            "electric_reaper_lateness_seconds",
            "How long past its grace deadline each expiry (stopping → stopped) was written.",
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        # The signal children, made once: a committed signal costs a dict lookup and an increment.
        self._signal_counts: dict[tuple[Signal, str], Callable[[], None]] = {}
        self._unsubscribe = store.hub.subscribe_batches(self._on_batch)
        self.registry.register(_StoreCounters(store))

    def follow(self, watches: Watches, runtime: Runtime, reaper: Reaper) -> None:
        """Report these live objects' gauges when scraped, and the reaper's expiries."""
        self.registry.register(_Live(watches, runtime, reaper))
        reaper.expired_late = self.reaper_lateness.observe

    def close(self) -> None:
        self._unsubscribe()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def signal_rejected(self, signal: Signal) -> None:
        self._count_signal(signal, REJECTED)

    def _count_signal(self, signal: Signal, outcome: str) -> None:
        count = self._signal_counts.get((signal, outcome))
        if count is None:
            count = self._signal_counts[signal, outcome] = self.signals.labels(signal.value, outcome).inc
        count()

    def _on_batch(self, commits: Sequence[Commit], writes: int, seconds: float) -> None:
        self.writes.inc(writes)
        self.batches.inc()
        self.commit_seconds.observe(seconds)
        for commit in commits:
            result = commit.result
            if isinstance(result, Signalled):
                decision = result.decision
                self._count_signal(decision.cell.signal, decision.outcome.value)
            elif result == RUNTIME_WRITE:
                for event in commit.events:
                    if event.kind == "exec":  # only these are decoded: receipts are few
                        receipt = pb.Event.FromString(event.body).exec
                        self.exec_actions.labels(
                            EXEC_ACTION_NAMES.get(receipt.action, "unspecified"),
                            EXEC_DISPOSITION_NAMES.get(receipt.disposition, "unspecified"),
                        ).inc()


class _StoreCounters(Collector):
    """The store's backend-only counters (``Store.counters``: e.g. PostgreSQL's lone writes on a
    guess), read at each scrape."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterable[Metric]:
        for counter in self.store.counters():
            family = CounterMetricFamily(counter.name, counter.help, labels=counter.labels)
            for values, value in counter.samples:
                family.add_metric(values, value)
            yield family


def _top(tally: Tally[str], n: int) -> dict[str, int]:
    """The ``n`` largest counts by name (ties by name), the rest summed under ``OTHER``."""
    ranked = sorted(tally.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ranked[:n])
    rest = sum(count for _, count in ranked[n:])
    if rest:
        kept[OTHER] = kept.get(OTHER, 0) + rest
    return kept


class _Live(Collector):
    """Gauges read from the server's live objects at each scrape."""

    def __init__(self, watches: Watches, runtime: Runtime, reaper: Reaper) -> None:
        self.watches = watches
        self.runtime = runtime
        self.reaper = reaper

    def collect(self) -> Iterable[Metric]:
        streams = GaugeMetricFamily("electric_watch_streams", "Open watch streams, by kind.", labels=["kind"])
        for kind, count in self.watches.watching().items():
            streams.add_metric([kind], count)
        yield streams

        sessions = list(self.runtime.sessions.values())
        yield GaugeMetricFamily("electric_worker_sessions", "Connected worker sessions.", value=len(sessions))
        workers = GaugeMetricFamily(
            "electric_workers",
            f"Connected workers hosting a type, by type and code version (the top {TOP_TYPES} types "
            f"and {TOP_CODE_VERSIONS} versions of each; the rest as {OTHER}).",
            labels=["type", "code_version"],
        )
        by_type = Tally(type_ for s in sessions for type_ in s.types)
        kept = _top(by_type, TOP_TYPES)
        versions: dict[str, Tally[str]] = {type_: Tally() for type_ in kept}
        for session in sessions:
            for type_ in session.types:
                versions[type_ if type_ in versions else OTHER][session.code_version] += 1
        for type_, tally in versions.items():
            for version, count in _top(tally, TOP_CODE_VERSIONS).items():
                workers.add_metric([type_, version], count)
        yield workers

        yield GaugeMetricFamily(
            "electric_leases_held", "Entities leased to a worker.", value=len(self.runtime.leases)
        )
        yield GaugeMetricFamily(
            "electric_grace_deadlines_pending",
            "Entities whose SIGTERM grace deadline the reaper has armed.",
            value=self.reaper.pending_deadlines,
        )
