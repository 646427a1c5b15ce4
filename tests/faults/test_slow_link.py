"""A slow link to the real S3 endpoint (the run's Ceph RGW): a TCP proxy that delays every chunk and
limits its rate in both directions, then is cut mid-upload.

What must hold: an offload and a read across the slow link are byte-exact (every page checked on the way
back), a link cut while a multipart upload is open fails the offload with a one-line `Tier2Error` and
leaves no chunk row, and once a link is back a rerun offloads everything and GC leaves the bucket holding
exactly what metadata references, with no upload in progress.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.config import Config

from tests.faults.harness import OFFLOAD_TIMEOUT, check_invariants, gc_all, settle
from tests.integration.helpers import bucket_keys, entries, make_deps, open_uploads, produce
from tiering.errors import CorruptObjectError, Tier2Error
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.offload import offload_ledger, offload_many
from tiering.tier2.objects import RangeStream
from tiering.tier2.reader import tier2_opener

KIB = 1024
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)


class SlowLink:
    """127.0.0.1:<port> forwarding to `target` (host, port); each chunk of up to 16 KiB waits `delay` seconds
    plus its size over `rate` bytes per second before it is passed on. `cut()` closes the listener and every
    connection at once, as a link that goes away."""

    def __init__(self, target: tuple[str, int], rate: float, delay: float):
        self.target, self.rate, self.delay = target, rate, delay
        self.loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self.held: list[bytes] = []  # hold_writes(): the request lines held so far
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    breaks_left = 0  # break_responses(): connections still to be broken
    break_after = 0

    def break_responses(self, after: int, connections: int) -> None:
        """The next `connections` connections are reset once `after` bytes of responses went through each."""
        self.break_after, self.breaks_left = after, connections

    drips_left = 0  # drip_responses(): connections still to be slowed to a drip
    drip_after = 0
    dripped = 0  # pieces of responses dripped so far

    def drip_responses(self, after: int, connections: int) -> None:
        """The next `connections` connections pass one byte of responses every 0.2 s once `after` bytes went
        through each: every socket read gets a byte well within any read timeout, the body never ends."""
        self.drip_after, self.drips_left = after, connections

    flips_left = 0  # flip_response(): bytes still to be flipped, one per connection
    flip_at = 0
    flipped = 0  # bytes flipped so far

    def flip_response(self, at: int, connections: int = 1) -> None:
        """In the next `connections` connections whose responses reach byte `at` (counted over the
        connection's responses), that byte arrives with its bits inverted, once: a fault of the link, not of
        the stored object."""
        self.flip_at, self.flips_left = at, connections

    holding = None  # hold(): which request lines get no answer

    def hold(self, lines=None) -> None:
        """From now on (until hold(None)), a connection that carries a request whose first line `lines` takes
        never passes an answer back from that request on."""
        self.holding = lines

    def hold_writes(self, on: bool = True) -> None:
        """A write path black-holed while HEADs and GETs are answered: PUTs and POSTs get no answer."""
        self.hold((lambda line: line.startswith((b"PUT ", b"POST "))) if on else None)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None = None,
                    other: asyncio.StreamWriter | None = None, flip: int | None = None,
                    drip: int | None = None, conn: dict | None = None, requests: bool = False) -> None:
        passed = 0
        try:
            while data := await reader.read(16 * KIB):
                line = data.split(b"\r\n", 1)[0]
                if requests and self.holding is not None and line[:1].isupper() and self.holding(line):
                    conn["held"] = True  # set before the request goes on: its answer comes after
                    self.held.append(line)
                if not requests and conn.get("held"):
                    continue
                if drip is not None and passed + len(data) > drip:
                    self.dripped += 1
                    for i in range(len(data)):
                        if passed + i >= drip:
                            await asyncio.sleep(0.2)
                        writer.write(data[i:i + 1])
                        await writer.drain()
                    passed += len(data)
                    continue
                if flip is not None and self.flips_left and passed <= flip < passed + len(data):
                    self.flips_left -= 1
                    at = flip - passed
                    data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
                    self.flipped += 1
                if limit is not None and passed + len(data) > limit:  # a reset mid-response
                    writer.write(data[:limit - passed])
                    await writer.drain()
                    writer.transport.abort()
                    other.transport.abort()
                    return
                passed += len(data)
                await asyncio.sleep(self.delay + len(data) / self.rate)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_r, client_w) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        self._writers |= {client_w, server_w}
        limit = flip = drip = None
        if self.drips_left:
            self.drips_left -= 1
            drip = self.drip_after
        if self.breaks_left:
            self.breaks_left -= 1
            limit = self.break_after
        if self.flips_left:  # counted when flipped: a connection whose responses end before `at` takes none
            flip = self.flip_at
        conn: dict = {}
        await asyncio.gather(self._pipe(client_r, server_w, conn=conn, requests=True),
                             self._pipe(server_r, client_w, limit, server_w, flip, drip, conn))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        async def close_all():
            self.server.close()
            for w in self._writers:
                w.transport.abort()
        asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(10)

    def stop(self) -> None:
        self.cut()

        async def end_all():  # a held connection's pipes may still wait on the server
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(end_all(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def link(s3_settings):
    endpoint = urlsplit(s3_settings["endpoint_url"])
    links = []

    def make(rate: float = 16 * 1024 * KIB, delay: float = 0.005) -> SlowLink:
        links.append(SlowLink((endpoint.hostname, endpoint.port), rate, delay))
        return links[-1]
    yield make
    for made in links:
        made.stop()


def product_deps_over(over, s3_settings, db, bucket, tier1_root):
    """Deps whose S3 client is the product's (make_client: its pause after a timeout, its deadlines) over the
    link `over`, with TIERING_S3_TIMEOUT_SECONDS 1 for quick tests."""
    from tiering.config import Settings
    from tiering.tier2.client import make_client

    settings = Settings(database_url="postgresql://unused/unused", bucket=bucket, tier1_root=tier1_root,
                        s3_endpoint_url=over.url, aws_access_key_id=s3_settings["aws_access_key_id"],
                        aws_secret_access_key=s3_settings["aws_secret_access_key"],
                        aws_region=s3_settings["region_name"], s3_timeout_seconds=1)
    return make_deps(db, make_client(settings), bucket, tier1_root, offload_timeout=OFFLOAD_TIMEOUT)


def deps_over(link, s3_settings, db, bucket, tier1_root):
    s3 = boto3.client("s3", **{**s3_settings, "endpoint_url": link.url},
                      config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=2,
                                    read_timeout=20))
    return make_deps(db, s3, bucket, tier1_root, offload_timeout=OFFLOAD_TIMEOUT, upload_concurrency=2)


def test_offload_and_read_across_a_slow_link_are_byte_exact(link, s3_settings, db, bucket, tier1_root):
    deps = deps_over(link(rate=8 * 1024 * KIB, delay=0.005), s3_settings, db, bucket, tier1_root)
    # ledger 0: ~6 MiB, two parts of the 5 MiB blocks; ledger 1 small
    expected = produce(deps, "slow", [entries("big", 60, 100 * KIB), entries("small", 10, 10 * KIB)],
                       TopicPolicy(**BIG), open_tail=[b"tail"])
    report = offload_many(deps, deps.meta.list_ledgers("slow", [S.SEALED]))
    assert sorted(report.offloaded) == [0, 1] and not report.failed, report
    for led in deps.meta.list_ledgers("slow", [S.OFFLOADED]):
        deps.meta.mark_tier1_deleted(led)  # reads must come back over the link
        deps.tier1.delete("slow", led.ledger_id)
    check_invariants(deps, db, {"slow": expected})


def test_a_link_cut_mid_upload_fails_cleanly_and_a_rerun_converges(link, s3_settings, db, bucket, tier1_root):
    first = link()
    deps = deps_over(first, s3_settings, db, bucket, tier1_root)
    expected = produce(deps, "cut", [entries("big", 60, 100 * KIB), entries("small", 10, 10 * KIB)],
                       TopicPolicy(**BIG), open_tail=[b"tail"])
    led0, led1 = deps.meta.list_ledgers("cut", [S.SEALED])

    def cut(step):
        if step == "part":  # one part stored, the multipart upload open: the link goes away
            first.cut()

    with pytest.raises(Tier2Error) as failure:
        offload_ledger(deps, led0, cut)
    msg = str(failure.value)
    assert "\n" not in msg and msg.startswith("S3 ") and s3_settings["aws_secret_access_key"] not in msg, msg
    for led in deps.meta.list_ledgers("cut", [S.SEALED, S.OFFLOADING, S.OFFLOADED]):
        assert led.state in (S.SEALED, S.OFFLOADING) and deps.meta.get_chunk(led) is None

    deps = deps_over(link(), s3_settings, db, bucket, tier1_root)  # the link is back
    settle(db)
    report = offload_many(deps, deps.meta.list_ledgers("cut", [S.SEALED]) + deps.meta.stale_offloads(OFFLOAD_TIMEOUT))
    assert sorted(report.offloaded) == [0, 1] and not report.failed, report
    gc_all(deps)  # the cut attempt's upload is aborted or its objects collected
    check_invariants(deps, db, {"cut": expected})
    assert len(bucket_keys(deps)) == 4 and open_uploads(deps) == []


@pytest.fixture
def offloaded_topic(deps):
    """A topic of one ~6 MiB ledger, offloaded, its tier-1 copy gone: reads come from tier 2 only."""
    expected = produce(deps, "broken", [entries("big", 60, 100 * KIB)], TopicPolicy(**BIG), open_tail=[b"tail"])
    [led] = deps.meta.list_ledgers("broken", [S.SEALED])
    offload_ledger(deps, led)
    led = deps.meta.mark_tier1_deleted(deps.meta.get_ledger("broken", 0))
    deps.tier1.delete("broken", 0)
    return expected, led


def _read_over(link, s3_settings, db, bucket, tier1_root, led):
    deps = deps_over(link, s3_settings, db, bucket, tier1_root)
    return deps, dict(tier2_opener(deps.bucket)(led, deps.meta.get_chunk(led)).iter_entries(0, led.entry_count - 1))


def test_a_read_whose_response_breaks_off_goes_on_from_the_byte_reached(
        link, s3_settings, db, bucket, tier1_root, offloaded_topic, caplog):
    expected, led = offloaded_topic
    over = link(rate=64 * 1024 * KIB, delay=0)
    over.break_responses(after=1536 * KIB, connections=2)  # the data GET, and the GET going on after it, break
    caplog.set_level(logging.WARNING, logger="tiering.tier2.objects")
    deps, got = _read_over(over, s3_settings, db, bucket, tier1_root, led)
    assert got == {e: v for (_, e), v in expected.items() if _ == 0}
    assert [r for r in caplog.records if "broke off" in r.getMessage()], "no read broke off: the test tested nothing"
    check_invariants(deps, db, {"broken": expected})


def test_a_read_that_keeps_breaking_off_fails_with_one_line(
        link, s3_settings, db, bucket, tier1_root, offloaded_topic):
    _, led = offloaded_topic
    over = link(rate=64 * 1024 * KIB, delay=0)
    over.break_responses(after=256 * KIB, connections=10**6)
    with pytest.raises(Tier2Error) as failure:
        _read_over(over, s3_settings, db, bucket, tier1_root, led)
    msg = str(failure.value)
    assert "\n" not in msg and s3_settings["aws_secret_access_key"] not in msg, msg


def test_an_object_replaced_while_its_read_broke_off_is_not_mixed_in(
        link, s3_settings, db, bucket, tier1_root, offloaded_topic):
    _, led = offloaded_topic
    over = link(rate=64 * 1024 * KIB, delay=0)
    deps = deps_over(over, s3_settings, db, bucket, tier1_root)
    ch = deps.meta.get_chunk(led)
    over.break_responses(after=1024 * KIB, connections=1)
    stream = RangeStream(deps.bucket, ch.data_key, ch.data_offset, ch.data_length)
    first = stream.read(512 * KIB)
    s3 = boto3.client("s3", **s3_settings)  # the same bytes, written again: a new object (new ETag)
    body = s3.get_object(Bucket=bucket, Key=ch.data_key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=ch.data_key, Body=body[:-1] + bytes([body[-1] ^ 1]))
    with pytest.raises(CorruptObjectError, match="replaced while being read"):
        stream.read(ch.data_length - len(first))
    stream.close()


def test_a_byte_flipped_on_the_way_once_marks_no_sound_copy_lost(
        link, s3_settings, db, bucket, tier1_root, offloaded_topic, caplog):
    """Repair with no tier-1 copy marks a ledger lost when its tier-2 copy fails; one GET's byte flipped in
    transit (the stored object sound) must not: the copy is judged on a second look."""
    from tiering.ops.repair import repair

    expected, led = offloaded_topic
    over = link(rate=64 * 1024 * KIB, delay=0)
    deps = deps_over(over, s3_settings, db, bucket, tier1_root)
    over.flip_response(at=3 * 1024 * KIB)  # inside the data GET's ~6 MiB body, on the connection the check uses
    caplog.set_level(logging.WARNING, logger="tiering.ops.repair")
    report = repair(deps, "broken")
    assert over.flipped == 1, "no byte was flipped: the test tested nothing"
    assert (report.findings, report.lost, report.failed) == ([], [], [])
    assert not deps.meta.get_ledger("broken", 0).lost
    assert [r for r in caplog.records if "checking its copy again" in r.getMessage()]
    check_invariants(deps, db, {"broken": expected})


def test_recovery_judges_a_copy_flipped_on_the_way_once_by_a_second_read(
        link, s3_settings, db, bucket, tier1_root, offloaded_topic, caplog):
    """recover-from-bucket --check-pages with the database lost: one GET's byte flipped in transit must not
    have the only copy judged bad and its ledger recorded lost."""
    from sqlalchemy import text

    from tiering.ops.recover import recover_from_bucket

    expected, _ = offloaded_topic
    with db.begin() as conn:  # the database lost: the bucket is all there is
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task CASCADE"))
    over = link(rate=64 * 1024 * KIB, delay=0)
    deps = deps_over(over, s3_settings, db, bucket, tier1_root)
    over.flip_response(at=3 * 1024 * KIB)
    caplog.set_level(logging.WARNING, logger="tiering.ops.recover")
    report = recover_from_bucket(db, deps.bucket, "broken", concurrency=1, check_pages=True, tier1=deps.tier1)
    assert over.flipped == 1, "no byte was flipped: the test tested nothing"
    assert report.lost_recorded == [] and ("broken", 0) in report.ledgers_recovered, report
    assert not deps.meta.get_ledger("broken", 0).lost
    assert [r for r in caplog.records if "reading it again" in r.getMessage()]
    check_invariants(deps, db, {"broken": expected})


def _over_a_drip(link, s3_settings, db, bucket, tier1_root, connections: int, monkeypatch):
    """A read over a link that drips after 1 MiB, on a client whose read timeout is 2 s and whose bodies need
    average no particular rate (the deadline is then the read timeout alone, for a quick test)."""
    import tiering.tier2.stalls as stalls

    monkeypatch.setattr(stalls, "MIN_BODY_RATE", 1 << 40)
    over = link(rate=64 * 1024 * KIB, delay=0)
    over.drip_responses(after=1024 * KIB, connections=connections)
    s3 = boto3.client("s3", **{**s3_settings, "endpoint_url": over.url},
                      config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=2,
                                    read_timeout=2))
    return make_deps(db, s3, bucket, tier1_root, offload_timeout=OFFLOAD_TIMEOUT)


def test_a_body_that_drips_is_cut_at_its_deadline_and_read_on(
        link, s3_settings, db, bucket, tier1_root, offloaded_topic, caplog, monkeypatch):
    """A link passing a byte every 0.2 s never trips botocore's read timeout (each socket read gets a byte):
    the read's deadline cuts the body, and a new ranged GET goes on from the byte reached."""
    expected, led = offloaded_topic
    deps = _over_a_drip(link, s3_settings, db, bucket, tier1_root, 2, monkeypatch)
    caplog.set_level(logging.WARNING, logger="tiering.tier2.objects")
    got = dict(tier2_opener(deps.bucket)(led, deps.meta.get_chunk(led)).iter_entries(0, led.entry_count - 1))
    assert got == {e: v for (lid, e), v in expected.items() if lid == 0}
    assert [r for r in caplog.records if "BodyStalled" in r.getMessage()], "nothing dripped: the test tested nothing"


def test_a_body_that_keeps_dripping_fails_with_one_line_in_bounded_time(
        link, s3_settings, db, bucket, tier1_root, offloaded_topic, monkeypatch):
    _, led = offloaded_topic
    deps = _over_a_drip(link, s3_settings, db, bucket, tier1_root, 10**6, monkeypatch)
    started = time.monotonic()
    with pytest.raises(Tier2Error) as failure:
        dict(tier2_opener(deps.bucket)(led, deps.meta.get_chunk(led)).iter_entries(0, led.entry_count - 1))
    assert time.monotonic() - started < 60  # four GETs of ~2 s each, not the days a drip would take
    msg = str(failure.value)
    assert "BodyStalled" in msg and "\n" not in msg and s3_settings["aws_secret_access_key"] not in msg, msg


def _listing_over_a_drip(link, s3_settings, connections: int, monkeypatch):
    """The product's S3 client over a link dripping after 300 bytes of a response (a listing's first keys), the
    deadline of a read 1 s for a quick test."""
    import tiering.tier2.stalls as stalls
    from tiering.tier2.client import s3_client

    monkeypatch.setattr(stalls, "deadline_seconds", lambda s3, size: 1.0)
    over = link(rate=64 * 1024 * KIB, delay=0)
    client = s3_client(endpoint_url=over.url, access_key=s3_settings["aws_access_key_id"],
                       secret_key=s3_settings["aws_secret_access_key"], session_token=None,
                       region=s3_settings["region_name"], ca_bundle=None)
    over.drip_responses(after=300, connections=connections)
    return over, client


def test_a_listing_that_drips_once_is_sent_again(link, s3_settings, bucket, monkeypatch):
    """botocore reads a listing's body whole before parsing it: a drip kept `recover-from-bucket` and the
    sweep waiting for days. The read has the same deadline as an object's body, and the request is retried."""
    from tiering.tier2.objects import Bucket, list_objects

    s3 = boto3.client("s3", **s3_settings)
    keys = [f"drip/{i:04d}" for i in range(40)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    over, client = _listing_over_a_drip(link, s3_settings, 1, monkeypatch)
    assert [o["Key"] for o in list_objects(Bucket(client, bucket, "drip/"))] == keys
    assert over.dripped, "nothing dripped: the test tested nothing"


def test_a_listing_that_keeps_dripping_fails_in_bounded_time(link, s3_settings, bucket, monkeypatch):
    from botocore.exceptions import BotoCoreError

    from tiering.tier2.objects import Bucket, list_objects

    boto3.client("s3", **s3_settings).put_object(Bucket=bucket, Key="drip/one", Body=b"x")
    _, client = _listing_over_a_drip(link, s3_settings, 10**6, monkeypatch)
    started = time.monotonic()
    with pytest.raises(BotoCoreError, match="slower than the read's deadline"):
        list(list_objects(Bucket(client, bucket, "drip/")))
    assert time.monotonic() - started < 60  # five attempts of ~1 s, not the days a drip would take


def test_writes_that_get_no_answer_cost_one_request_not_one_per_ledger(link, s3_settings, db, bucket, tier1_root):
    """A write path black-holed while HEADs are answered: every request waits out its timeouts and retries
    (about five minutes each with the default 60 s), and an offload went on to the next ledger because the
    bucket answered its HEAD. The product's client pauses after one request timed out: the first ledger
    fails, the others are not attempted, and once the link answers again a run offloads them all."""
    over = link(rate=64 * 1024 * KIB, delay=0)
    deps = product_deps_over(over, s3_settings, db, bucket, tier1_root)
    expected = produce(deps, "hole", [entries(f"l{i}", 5, 1 * KIB) for i in range(3)], TopicPolicy(**BIG),
                       open_tail=[b"tail"])
    over.hold_writes()
    report = offload_many(deps, deps.meta.list_ledgers("hole", [S.SEALED]))
    assert not report.offloaded and sorted(report.failed) == [0, 1, 2], report
    assert "ReadTimeoutError" in report.failed[0], report
    assert all(report.failed[i].startswith("not attempted") for i in (1, 2)), report
    held = {line.split()[1] for line in over.held}
    assert len(held) == 1, f"held: {held}: one request's attempts, not one request per ledger"

    over.hold_writes(False)
    time.sleep(1.2)  # the pause (TIERING_S3_TIMEOUT_SECONDS) is over: the next request is sent
    settle(db)
    report = offload_many(deps, deps.meta.list_ledgers("hole", [S.SEALED]) + deps.meta.stale_offloads(OFFLOAD_TIMEOUT))
    assert sorted(report.offloaded) == [0, 1, 2] and not report.failed, report
    gc_all(deps)
    check_invariants(deps, db, {"hole": expected})


def test_one_object_that_gets_no_answer_fails_alone_while_the_rest_are_answered(
        link, s3_settings, db, bucket, tier1_root):
    """The pause after a timeout is for a link that stopped answering, not for one stuck object (a placement
    group that is not active blocks only the objects mapped to it): while other requests of the client get
    answers, the stuck one fails alone and the next read of another object goes out."""
    over = link(rate=64 * 1024 * KIB, delay=0)
    deps = product_deps_over(over, s3_settings, db, bucket, tier1_root)
    expected = produce(deps, "one", [entries("a", 5, 1 * KIB), entries("b", 5, 1 * KIB)], TopicPolicy(**BIG),
                       open_tail=[b"tail"])
    offload_many(deps, deps.meta.list_ledgers("one", [S.SEALED]))
    stuck, fine = (deps.meta.get_ledger("one", i) for i in (0, 1))
    stuck_key = deps.meta.get_chunk(stuck).data_key.rsplit("/", 1)[1].encode()
    over.hold(lambda line: line.startswith(b"GET ") and stuck_key + b" " in line)  # its data object's GETs
    stop = threading.Event()

    def others_answered():  # the rest of the process's traffic, answered all along
        while not stop.wait(0.2):
            deps.bucket.s3.head_bucket(Bucket=bucket)
    beside = threading.Thread(target=others_answered, daemon=True)
    beside.start()
    try:
        with pytest.raises(Tier2Error, match="ReadTimeoutError"):
            dict(tier2_opener(deps.bucket)(stuck, deps.meta.get_chunk(stuck)).iter_entries(0, 4))
        got = dict(tier2_opener(deps.bucket)(fine, deps.meta.get_chunk(fine)).iter_entries(0, 4))
    finally:
        stop.set()
        beside.join(10)
    assert got == {e: v for (lid, e), v in expected.items() if lid == 1}
    assert over.held, "nothing held: the test tested nothing"
