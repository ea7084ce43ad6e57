"""The batch tier's worker: drains the queue with the capacity interactive traffic leaves.

Inside every proxy by default (`batch.run_in_proxy`), and in `switchyard worker` processes. It
takes a line only while this process serves fewer than `batch.yield_at_in_flight` interactive
requests and no model's backend reports saturation, runs at most `batch.concurrency` lines at once,
and runs each as any request is run (`relay`: rate limits, routing, `auto` and `cascade`, saturation,
the worst-case reservation in the team's budgets, retries and fallbacks, metering), at
`batch.price_factor` of each model's price. A line's usage records are written before its result,
numbered after any an earlier run of the line left, so a line run twice around a crash is one
request of the team with every attempt's cost. A refusal that may pass (rate limited, the model
unavailable or saturated) is not a result: the line is queued again after a back-off, until its
batch's window ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.exceptions import RedisError

from switchyard.batch.batches_wire import is_answer
from switchyard.batch.jobs import Batch, Result, line_request_id
from switchyard.batch.line_queue import Work
from switchyard.batch.lines import LineError, check_lines
from switchyard.batch.spare_capacity import SpareCapacity
from switchyard.batch.tier import BatchTier
from switchyard.billing.records import UsageRecord
from switchyard.billing.store import StoreError
from switchyard.billing.teams import Principal
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import AuthenticationFailed, InvalidRequest, NotConfigured, SwitchyardError, error_body
from switchyard.core.messages_wire import MessagesRequest
from switchyard.core.prices import Price
from switchyard.core.responses_wire import ResponsesRequest
from switchyard.core.settings import Settings
from switchyard.core.supervision import SupervisedTask
from switchyard.gateway.aliases import alias_of
from switchyard.gateway.answer_shape import PASS_THROUGH
from switchyard.gateway.decide import Asked
from switchyard.gateway.messages_stream import as_chat_request as as_chat_message
from switchyard.gateway.parsing import parse_request
from switchyard.gateway.relay import LineTerms, Origin, relay
from switchyard.gateway.request_end import end_exchange
from switchyard.gateway.request_log import RequestLine
from switchyard.gateway.responses_stream import as_chat_request
from switchyard.gateway.services import Services, build_services

logger = logging.getLogger("switchyard.batch")

DRAIN_S = 10.0  # at shutdown, how long running lines may take to finish
RETRY_BASE_S, RETRY_MAX_S = 1.0, 30.0  # a line refused for now runs again after 1, 2, 4, … 30 s
MAX_TRIES = 6  # runs of a line refused for now; the last refusal is its result (an error-file entry)
BATCH_FRESH_S = 1.0  # a batch's status, read once for its lines in this long (a cancel is seen after it)
_PASSING = frozenset({500, 502, 503, 504})  # refusals that may pass: the line is run again later


@dataclass(slots=True)
class _Collected:
    """A line's usage records, held until they are written with its result."""

    records: list[UsageRecord] = field(default_factory=list)

    def record(self, record: UsageRecord) -> None:
        self.records.append(record)

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _body_of(raw: bytes) -> Any:
    """A line's `body` (validated when the batch was: only a file deleted since reads otherwise)."""
    try:
        return orjson.loads(raw)["body"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise InvalidRequest("The batch's input file was deleted or changed after it was validated.") from None


def batch_prices(prices: dict[str, Price], factor: float) -> dict[str, Price]:
    return {name: price.scaled(factor) for name, price in prices.items()}


def _is_passing(status: int, body: str) -> bool:
    if status in _PASSING:
        return True
    return status == 429 and '"insufficient_quota"' not in body


class BatchRunner:
    def __init__(self, services: Services, tier: BatchTier, load: Callable[[], int] = lambda: 0) -> None:
        self.services = services
        self.tier = tier
        self.settings = tier.settings
        self.load = load  # interactive requests this process serves now
        self.prices = batch_prices(services.prices, tier.settings.price_factor)
        self.running: dict[tuple[str, str], tuple[Work, asyncio.Task[None]]] = {}  # by stream and entry id
        self.validating: Work | None = None
        self._batches: dict[str, tuple[float, Batch]] = {}  # by id: (monotonic time read, the batch)
        self.spare = SpareCapacity(tier.settings, services.registry, load)

    # the loop

    async def run_forever(self) -> None:
        tending = asyncio.create_task(self._tend_forever())
        touching = asyncio.create_task(self._touch_forever())
        validating = asyncio.create_task(self._validate_forever())
        claim_at = 0.0  # monotonic time of the next look for abandoned lines
        try:
            while True:
                await self._wait_for_room()
                room = self.settings.concurrency - len(self.running)
                try:
                    # abandoned lines fill the same free slots as new ones: never more than `concurrency`
                    works: list[Work] = []
                    if time.monotonic() >= claim_at:
                        claim_at = time.monotonic() + self._upkeep_every_s
                        works = await self.tier.queue.claim_abandoned(room)
                    works = works or await self.tier.queue.take(room)
                except (RedisError, OSError) as exc:
                    logger.warning("the batch queue is out of reach (%s); trying again", exc)
                    await asyncio.sleep(1.0)
                    continue
                for work in works:
                    self._spawn(work)
        finally:
            tending.cancel()
            validating.cancel()
            await self._drain()
            touching.cancel()
            await asyncio.gather(tending, touching, validating, return_exceptions=True)

    async def _validate_forever(self) -> None:
        """New batches, checked one at a time as they come: beside the lines, not behind them."""
        while True:
            try:
                works = await self.tier.queue.take(1, validations=True)
            except (RedisError, OSError) as exc:
                logger.warning("the batch queue is out of reach (%s); trying again", exc)
                await asyncio.sleep(1.0)
                continue
            for work in works:
                self.validating = work  # tended with the running lines
                try:
                    await self._handle(work)
                finally:
                    self.validating = None

    def _spawn(self, work: Work) -> None:
        key = (work.stream, work.entry_id)
        if key in self.running:
            return
        task = asyncio.create_task(self._handle(work), name=f"batch:{work.batch_id}:{work.line}")
        self.running[key] = (work, task)
        task.add_done_callback(lambda _: self.running.pop(key, None))

    async def _wait_for_room(self) -> None:
        """A free slot, and interactive traffic leaving room (`switchyard.batch.spare_capacity`)."""
        while len(self.running) >= self.settings.concurrency:
            await asyncio.wait({task for _, task in self.running.values()}, return_when=asyncio.FIRST_COMPLETED)
        await self.spare.wait()

    async def _drain(self) -> None:
        tasks = {task for _, task in self.running.values()}
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=DRAIN_S)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
            logger.warning("%d batch line(s) cut short at shutdown: they run again elsewhere", len(late))

    @property
    def _upkeep_every_s(self) -> float:
        return min(self.settings.claim_after_s / 3, 5.0)

    async def _tend_forever(self) -> None:
        """End batches whose window ran out or that were cancelled, and finish those whose
        finalizer died."""
        every_s = self._upkeep_every_s
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.tend()
            except (RedisError, OSError, StoreError) as exc:
                logger.warning("batch upkeep failed (%s); trying again in %g s", exc, every_s)
            except Exception:
                logger.exception("batch upkeep failed; trying again in %g s", every_s)

    async def _touch_forever(self) -> None:
        """The entries this worker holds stay its own (their idle time starts again), on a loop of
        its own: a long sweep must not let another worker take over a line still running here."""
        every_s = self.settings.claim_after_s / 3
        while True:
            await asyncio.sleep(every_s)
            held = [work for work, _ in self.running.values()]
            try:
                await self.tier.queue.touch(held + ([self.validating] if self.validating is not None else []))
            except (RedisError, OSError) as exc:
                logger.warning("could not keep this worker's batch lines (%s): another may take them over", exc)

    async def tend(self) -> None:
        now = time.time()
        for batch in await self.tier.batches.open_batches():
            await self.tier.finisher.sweep(batch, now)

    # one entry

    async def _handle(self, work: Work) -> None:
        try:
            if work.kind == "validate":
                await self.validate(work.batch_id)
            else:
                await self.run_line(work)
            await self.tier.queue.done([work])
        except asyncio.CancelledError:
            raise
        except (RedisError, OSError, StoreError) as exc:
            logger.warning("batch %s line %d left for later: %s", work.batch_id, work.line, exc)
        except Exception:  # left pending: claimed again after batch.claim_after_s
            logger.exception("batch %s line %d failed; it runs again later", work.batch_id, work.line)

    async def validate(self, batch_id: str) -> None:
        tier = self.tier
        batch = await tier.batches.get(batch_id)
        if batch is None or batch.status != "validating" or batch.ending is not None:
            return  # cancelled or expired before it was checked: the upkeep loop ends it
        stored = await tier.files.get(batch.input_file_id)
        if stored is None:
            error = LineError("file_not_found", f"The input file {batch.input_file_id} no longer exists.")
            await tier.batches.fail(batch_id, [error], 1)
            return
        max_line_bytes = self.services.settings.server.max_body_bytes  # a line is a request's body
        checked = await check_lines(tier.files.read(stored.id), batch.endpoint, self.settings.max_lines, max_line_bytes)
        if checked.num_errors:
            await tier.batches.fail(batch_id, checked.errors, checked.num_errors)
            return
        batch = await tier.batches.get(batch_id)
        if batch is None or batch.status != "validating" or batch.ending is not None:
            return  # cancelled while it was checked: nothing is queued, the upkeep loop ends it
        await tier.batches.set_lines(batch_id, checked.lines)
        await tier.queue.add([Work("", "line", batch_id, line.index) for line in checked.lines])
        await tier.batches.start(batch_id)  # cancelled meanwhile: its lines' entries find it so

    async def _batch(self, batch_id: str) -> Batch | None:
        """The batch as read at most BATCH_FRESH_S ago: its lines need not read it each."""
        now = time.monotonic()
        cached = self._batches.get(batch_id)
        if cached is not None and now - cached[0] < BATCH_FRESH_S:
            return cached[1]
        batch = await self.tier.batches.get(batch_id)
        if len(self._batches) > 1000:
            self._batches.clear()
        if batch is not None:
            self._batches[batch_id] = (now, batch)
        return batch

    async def run_line(self, work: Work) -> None:
        """Run one line and write its result (or queue it again, refused for now)."""
        batches = self.tier.batches
        batch = await self._batch(work.batch_id)
        if batch is None:
            return
        if batch.ending is not None or batch.status not in ("in_progress", "validating"):
            return  # ended (cancelled, expired) or ending: the upkeep loop gives its lines their errors
        if batch.expires_at <= time.time():
            return  # the window ran out: the upkeep loop expires it
        found = await batches.line(batch.id, work.line)
        if found is None:
            return
        line, has_result = found
        if has_result:
            await self.tier.finisher.finalize_if_done(batch.id)
            return
        request_id = line_request_id(batch.id, line.index)
        status, body, usage = await self._answer(batch, line.start, line.length, request_id)
        may_pass = _is_passing(status, body) and work.tries + 1 < MAX_TRIES
        result = None if may_pass else Result(line.index, line.custom_id, request_id, status, body)
        try:
            written, is_done = await batches.write_result(batch.id, result, usage)
        except StoreError:
            self._spill(usage)  # the database will not take it now: the ledger's writer keeps it
            raise  # and the line runs again later
        except asyncio.CancelledError:  # the server stops: what the line spent is metered, it runs again
            # the write, if it began, has ended by the time this reads (one writer; a transaction)
            after = await batches.line(batch.id, line.index) if result is not None else None
            if after is not None and not after[1]:
                await self._write_usage(usage)
            raise
        if result is None:  # a refusal that may pass: its usage is written, the line runs again later
            logger.info("batch %s: %s refused with %d; it runs again later", batch.id, request_id, status)
            await self._retry_later(work)
            return
        if written:
            outcome = "answered" if is_answer(result) else "failed"
            self.services.metrics.batch_lines.labels(batch.endpoint, outcome).inc()
        if is_done:
            await self.tier.finisher.finalize_if_done(batch.id)
        return

    async def _answer(
        self, batch: Batch, start: int, length: int, request_id: str
    ) -> tuple[int, str, list[UsageRecord]]:
        """The line's status, body and usage records."""
        services = self.services
        raw = await self.tier.files.read_range(batch.input_file_id, start, length)
        started_at = asyncio.get_running_loop().time()
        record_line = RequestLine(request_id=request_id, method="POST", path=batch.endpoint, started_at=time.time())
        record_line.team = batch.team or None
        record_line.key_id = batch.key_id
        try:
            principal = self._principal(batch)
            wire, parsed, shape = self._parse(batch.endpoint, _body_of(raw))
        except SwitchyardError as exc:
            record_line.requested_model = exc.requested_model
            end_exchange(services, record_line, None, exc.status_code, started_at, refused=exc)
            return exc.status_code, error_body(exc).decode(), []
        record_line.requested_model = wire.model
        alias = alias_of(services, parsed.model)
        if alias is not None:
            parsed.set_field("model", alias.model)
        collected = _Collected()
        terms = LineTerms(batch.id, self.prices, collected)
        asked = Asked(
            quality=alias.quality if alias is not None else None, priority="priority"
        )  # a saturated model: wait for it, never a smaller one instead
        try:
            relayed = await relay(services, Origin(request_id, terms=terms), principal, parsed, asked, shape)
        except asyncio.CancelledError:  # shutdown cut it short: what it spent is metered, the line runs again
            await self._write_usage(collected.records)
            raise
        end_exchange(services, record_line, relayed, relayed.status, started_at)
        return relayed.status, relayed.body.decode(), collected.records

    def _principal(self, batch: Batch) -> Principal | None:
        directory = self.services.directory
        if not directory.is_enabled:
            return None
        key = directory.key(batch.key_id) if batch.key_id is not None else None
        team = directory.teams.get(batch.team)
        if key is None or team is None or not key.is_usable(time.time()):
            raise AuthenticationFailed("The API key that created this batch has been revoked or has expired.")
        return Principal(team, key)

    def _parse(self, endpoint: str, body: Any) -> tuple[Any, Any, Any]:
        """(what the line asked, the request the relay runs, how its answer is written)."""
        if not isinstance(body, dict):
            raise InvalidRequest("The line's body must be a JSON object.", param="body")
        if body.get("stream"):
            raise InvalidRequest("A batch's requests cannot stream; leave 'stream' out.", param="stream")
        limits = self.services.settings.server.body_limits()
        raw = orjson.dumps(body)
        if endpoint == "/v1/chat/completions":
            chat = parse_request(ChatCompletionRequest, raw, limits)
            return chat, chat, PASS_THROUGH
        if endpoint == "/v1/completions":
            completion = parse_request(CompletionRequest, raw, limits)
            return completion, completion, PASS_THROUGH
        if endpoint == "/v1/embeddings":
            embedding = parse_request(EmbeddingRequest, raw, limits)
            return embedding, embedding, PASS_THROUGH
        if endpoint == "/v1/messages":
            message = parse_request(MessagesRequest, raw, limits)
            return message, *as_chat_message(message, self.services)
        asked = parse_request(ResponsesRequest, raw, limits)
        parsed, shape = as_chat_request(asked, self.services)
        return asked, parsed, shape

    async def _retry_later(self, work: Work) -> None:
        """Back off (holding the slot: a worker refused is a worker slowed), then queue the line
        again behind the others. The entry is acknowledged only after its successor is queued: a
        worker dying in between leaves it pending, to be claimed again."""
        await asyncio.sleep(min(RETRY_BASE_S * 2 ** min(work.tries, 8), RETRY_MAX_S))
        await self.tier.queue.add([Work("", "line", work.batch_id, work.line, work.tries + 1)])

    async def _write_usage(self, records: list[UsageRecord]) -> None:
        """A line cut short: its usage alone, numbered after its earlier runs' (else the ledger's
        writer keeps it for later)."""
        database = self.services.database
        if not records or database is None:
            return
        try:
            await database.insert_usage_with(records, [])
        except StoreError:
            self._spill(records)

    def _spill(self, records: list[UsageRecord]) -> None:
        ledger = self.services.ledger
        if ledger is not None:
            for record in records:
                ledger.record(record)


@contextlib.asynccontextmanager
async def open_batch_tier(services: Services, private_url: str | None = None) -> AsyncIterator[BatchTier | None]:
    """The batch tier on these services, closed on exit (None: it needs Valkey, `billing.redis_url`
    or else `private_url`, the private Valkey `serve` started, and a database, and one is missing)."""
    settings = services.settings
    url = settings.billing.valkey_url() or private_url
    if services.database is None or url is None:
        yield None
        return
    tier = BatchTier.open(settings.batch, services.database, url)
    try:
        yield tier
    finally:
        await tier.aclose()


def start_batch_worker(services: Services, tier: BatchTier, load: Callable[[], int]) -> SupervisedTask:
    """The batch worker, started and shown among the background tasks."""
    task = SupervisedTask("batch-worker", BatchRunner(services, tier, load).run_forever)
    services.background.append(task)
    task.start()
    return task


async def run_worker(settings: Settings) -> None:
    """`switchyard worker`: the services of a proxy without its HTTP server, draining batches
    until cancelled (SIGTERM, SIGINT), then letting its running lines finish (bounded)."""
    async with build_services(settings) as services, open_batch_tier(services) as tier:
        if tier is None:
            raise NotConfigured("a batch worker needs billing.redis_url and a database (billing.database_url)")
        logger.info("batch worker %s draining %s", tier.queue.consumer, tier.queue.stream)
        await BatchRunner(services, tier).run_forever()
