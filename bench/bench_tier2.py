"""Tier-2 benchmarks: our offloader and reader against peers on the same S3 endpoint, in one run.

Every timed case interleaves ours and the peers run by run (A B C, B C A, ...) and reports medians and the
ratio ours / peer, so a slow or noisy endpoint (a loopback server on a shared machine) moves both sides alike.

1. Offload throughput: `offload_ledger` (block size 8 MiB, 4 parts in flight, CRC32C per part, metadata
   transactions included) of ledgers written with ManagedLedgerWriter vs boto3 `upload_file` (s3transfer,
   classic manager, same part size and concurrency, CRC32C asked for too) of the tier-1 ledger files; for
   several ledgers also vs one s3transfer TransferManager given all files at once.
2. Sequential catch-up read of a 64 MiB offloaded ledger: ReadHandle over `tier2_opener` vs one raw streaming
   GET of the data object vs a Pulsar-style reader (one 1 MiB buffer, one ranged GET at a time, no
   read-ahead).
3. Cold random entry reads: a fresh reader (empty caches) per entry; S3 requests, bytes asked for and
   latency, ours vs the Pulsar-style reader.
4. Peak RSS of a fresh process offloading a large ledger and reading it back, vs block size x
   (concurrency + 1), and of a process doing s3transfer upload_file / a raw streaming GET of the same bytes.

Runs in a scratch database, a bucket and a temporary tier-1 root of its own (all removed at the end);
objects are deleted after every case to keep an in-memory endpoint small. Writes
bench/results/tier2.{md,json} (tier2-quick.{md,json} with --quick).

    set -a; . .local/env; set +a
    .venv/bin/python bench/bench_tier2.py --quick     # ~2 minutes
    .venv/bin/python bench/bench_tier2.py             # full sizes (8-12 minutes on 2 busy cores)
    the endpoint is TIERING_S3_ENDPOINT_URL: with `make services` this checkout's Ceph RGW; add
    --private-moto to run against a moto server of the bench's own instead (started and stopped by it);
    --pin gives the bench a core of its own (this checkout's Ceph daemons on CPU 0), as a remote S3 would
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from boto3.s3.transfer import TransferConfig  # noqa: E402
from s3transfer.manager import TransferManager  # noqa: E402

from benchkit import (BLOCK_SIZE, CONCURRENCY, MIB, PREFIX, ROOT, Env, endpoint, endpoint_kind,  # noqa: E402
                      loadavg, machine, median, mib, payload_bytes, pinned, proc_status, rnd, s3_client,
                      save)
from pulsar_reader import PulsarStyleReader  # noqa: E402
from tier2_report import report  # noqa: E402
from tiering.config import reuse_freed_buffers  # noqa: E402
from tiering.format.keys import data_key, index_key  # noqa: E402
from tiering.metadata import make_engine  # noqa: E402
from tiering.metadata.repository import MetadataStore  # noqa: E402
from tiering.model import Position  # noqa: E402
from tiering.ops.context import Deps, Knobs  # noqa: E402
from tiering.ops.offload import offload_ledger, offload_many  # noqa: E402
from tiering.read import Entry as ReadEntry, ReadHandle  # noqa: E402
from tiering.tier1 import Tier1Store  # noqa: E402
from tiering.tier2 import reader as t2reader  # noqa: E402
from tiering.tier2.objects import Bucket  # noqa: E402
from tiering.tier2.offloader import LedgerToUpload, upload_ledgers  # noqa: E402
from tiering.tier2.reader import ReaderCaches, tier2_opener  # noqa: E402
from tiering.workload import payload  # noqa: E402

FULL = dict(
    # (ledgers, MiB each, runs); a 16 MiB offload takes ~150 ms, and its ratio moves by 0.1 between runs of
    # five on a shared machine: 21 runs cost seconds and give a median worth quoting
    offload=[(1, 16, 21), (1, 64, 7), (8, 16, 3), (64, 1, 3), (1, 256, 3)],
    # The reader's memory is flat after the first blocks (see hwm_by_mib), so 256 MiB of the 1 GiB ledger
    # are read back (on moto, where each ranged GET copies the whole object, all of it takes >10 minutes).
    read_mib=64, read_runs=9, random_reads=40, rss_mib=1024, rss_read_mib=256)
QUICK = dict(
    offload=[(1, 16, 3), (8, 16, 2), (64, 1, 2), (1, 64, 2)],
    read_mib=64, read_runs=3, random_reads=15, rss_mib=128, rss_read_mib=None)



# ----------------------------------------------------------------------------------------------- plumbing

def transfer_config() -> TransferConfig:
    return TransferConfig(multipart_threshold=BLOCK_SIZE, multipart_chunksize=BLOCK_SIZE,
                          max_concurrency=CONCURRENCY, use_threads=True, preferred_transfer_client="classic")


UPLOAD_EXTRA = {"ChecksumAlgorithm": "CRC32C"}  # our parts carry CRC32C: make s3transfer do the same work


# ------------------------------------------------------------------------------------- case 1: offload

def bench_offload(env: Env, cases, entry_size: int) -> list[dict]:
    rows = []
    s3, tc = env.s3, transfer_config()
    for count, size_mib, runs in cases:
        size = size_mib * MIB
        total = count * size
        ours, peer, peer_tm, ours_req, s3_only = [], [], [], [], []
        for r in range(runs):
            _, leds, paths = env.write_ledgers(f"offload-{count}x{size_mib}", count, size, entry_size)

            def run_ours():
                before = env.counter.snapshot()[0]
                t0 = time.perf_counter()
                # as the CLI and the offload job do: small ledgers (< 8 MiB) of the topic go as one batch
                report = offload_many(env.deps, leds)
                assert len(report.offloaded) == len(leds), report
                ours.append(time.perf_counter() - t0)
                ours_req.append(env.counter.snapshot()[0] - before)

            def run_s3_only():
                t0 = time.perf_counter()
                for led in leds:
                    attempt = str(uuid.uuid4())
                    b = env.deps.bucket
                    with env.deps.tier1.reader(led.topic, led.ledger_id) as rd:
                        upload_ledgers(b, topic=led.topic, attempt=attempt,
                                       data_key=data_key(b.prefix, led.topic, attempt, led.ledger_id),
                                       index_key=index_key(b.prefix, led.topic, attempt, led.ledger_id),
                                       sources=iter([(LedgerToUpload(led.ledger_id, led.entry_count, 0),
                                                      rd.iter_framed(0, led.entry_count - 1))]),
                                       block_size=BLOCK_SIZE, concurrency=CONCURRENCY)
                s3_only.append(time.perf_counter() - t0)

            def run_peer():
                t0 = time.perf_counter()
                for n, p in enumerate(paths):
                    s3.upload_file(str(p), env.bucket, f"peer/{r}/{n}", ExtraArgs=UPLOAD_EXTRA, Config=tc)
                peer.append(time.perf_counter() - t0)

            def run_peer_tm():
                t0 = time.perf_counter()
                with TransferManager(s3, tc) as tm:
                    futs = [tm.upload(str(p), env.bucket, f"peertm/{r}/{n}", extra_args=UPLOAD_EXTRA)
                            for n, p in enumerate(paths)]
                    for f in futs:
                        f.result()
                peer_tm.append(time.perf_counter() - t0)

            order = [run_ours, run_peer, run_s3_only] + ([run_peer_tm] if count > 1 else [])
            order = order[r % len(order):] + order[:r % len(order)]  # rotate who goes first
            for fn in order:
                fn()
                env.reset()
            for p in paths:
                p.unlink()
        row = {"ledgers": count, "ledger_mib": size_mib, "runs": runs, "total_mib": mib(total),
               "ours_mib_s": rnd(mib(total) / median(ours)), "s3transfer_mib_s": rnd(mib(total) / median(peer)),
               "ours_s": [rnd(x, 3) for x in ours], "s3transfer_s": [rnd(x, 3) for x in peer],
               "ours_requests_per_run": median(ours_req),
               "ours_s3_only_mib_s": rnd(mib(total) / median(s3_only)), "ours_s3_only_s": [rnd(x, 3) for x in s3_only]}
        row["ratio_s3_only"] = rnd(row["ours_s3_only_mib_s"] / row["s3transfer_mib_s"], 2)
        row["ratio"] = rnd(row["ours_mib_s"] / row["s3transfer_mib_s"], 2)
        if peer_tm:
            row["s3transfer_tm_mib_s"] = rnd(mib(total) / median(peer_tm))
            row["s3transfer_tm_s"] = [rnd(x, 3) for x in peer_tm]
            row["ratio_tm"] = rnd(row["ours_mib_s"] / row["s3transfer_tm_mib_s"], 2)
        rows.append(row)
        print(f"offload {count:>3} x {size_mib:>4} MiB: ours {row['ours_mib_s']:7.1f} MiB/s "
              f"(S3 part only {row['ours_s3_only_mib_s']:.1f}), "
              f"upload_file {row['s3transfer_mib_s']:7.1f} MiB/s, ratio {row['ratio']:.2f}"
              + (f"; TransferManager all at once {row['s3transfer_tm_mib_s']:.1f} MiB/s, ratio {row['ratio_tm']:.2f}"
                 if peer_tm else "") + f"  [server RSS {env.server_rss()} MiB]", flush=True)
    return rows


def bench_small_ledgers(env: Env, count: int, size: int, entry_size: int) -> dict:
    """PUT requests (PutObject + UploadPart) and time to offload `count` small ledgers with offload_many
    (one batch) vs one upload_file per tier-1 file."""
    _, leds, paths = env.write_ledgers("small", count, size, entry_size)
    ops_before = dict(env.counter.ops)
    t0 = time.perf_counter()
    report = offload_many(env.deps, leds)
    ours_s = time.perf_counter() - t0
    assert len(report.offloaded) == count, report.first_error
    ops = {k: v - ops_before.get(k, 0) for k, v in env.counter.ops.items() if v - ops_before.get(k, 0)}
    env.reset()
    ops_before = dict(env.counter.ops)
    t0 = time.perf_counter()
    for n, p in enumerate(paths):
        env.s3.upload_file(str(p), env.bucket, f"peer/{n}", ExtraArgs=UPLOAD_EXTRA, Config=transfer_config())
    peer_s = time.perf_counter() - t0
    peer_ops = {k: v - ops_before.get(k, 0) for k, v in env.counter.ops.items() if v - ops_before.get(k, 0)}
    env.reset()
    puts = ops.get("PutObject", 0) + ops.get("UploadPart", 0)
    out = {"ledgers": count, "ledger_kib": size // 1024, "ours_puts": puts, "ours_requests": ops,
           "peer_puts": peer_ops.get("PutObject", 0) + peer_ops.get("UploadPart", 0), "ours_s": rnd(ours_s, 2),
           "peer_s": rnd(peer_s, 2), "ratio": rnd(peer_s / ours_s, 2)}
    print(f"offload {count} x {size // 1024} KiB: ours {puts} PUTs in {ours_s:.2f} s, upload_file "
          f"{out['peer_puts']} PUTs in {peer_s:.2f} s", flush=True)
    return out


# --------------------------------------------------------------------------- cases 2 and 3: reading

def offload_one(env: Env, tag: str, size: int, entry_size: int):
    """One offloaded ledger with no tier-1 copy (reads must go to tier 2). Returns (topic, ledger, chunk)."""
    topic, leds, paths = env.write_ledgers(tag, 1, size, entry_size)
    led = offload_ledger(env.deps, leds[0])
    led = env.deps.meta.mark_tier1_deleted(led)
    paths[0].unlink()
    return topic, led, env.deps.meta.get_chunk(led)


def bench_sequential(env: Env, size_mib: int, runs: int, entry_size: int) -> dict:
    topic, led, ch = offload_one(env, "seq", size_mib * MIB, entry_size)
    obj = ch.data_length
    times = {"ours": [], "ours_batches": [], "raw_get": [], "pulsar_style": []}
    reqs = {k: [] for k in times}

    def ours():
        pool = ThreadPoolExecutor(t2reader.READ_AHEAD, thread_name_prefix="bench-read")
        handle = ReadHandle(env.deps.meta, env.deps.tier1, tier2_opener(env.deps.bucket, ReaderCaches.new(), pool))
        n = nbytes = 0
        for item in handle.read(topic):
            assert isinstance(item, ReadEntry) and item.entry_id == n, item
            n += 1
            nbytes += len(item.data)
        pool.shutdown(wait=True)
        assert n == led.entry_count and nbytes == led.size_bytes, (n, nbytes)

    def ours_batches():  # the same scan through ReadHandle.read_batches: Arrow arrays, no object per entry
        pool = ThreadPoolExecutor(t2reader.READ_AHEAD, thread_name_prefix="bench-read")
        handle = ReadHandle(env.deps.meta, env.deps.tier1, tier2_opener(env.deps.bucket, ReaderCaches.new(), pool))
        n = nbytes = 0
        for batch in handle.read_batches(topic):
            assert batch.first_entry_id == n, batch
            n += len(batch.payloads)
            nbytes += payload_bytes(batch.payloads)
        pool.shutdown(wait=True)
        assert n == led.entry_count and nbytes == led.size_bytes, (n, nbytes)

    def raw_get():
        body = env.s3.get_object(Bucket=env.bucket, Key=ch.data_key)["Body"]
        n = sum(len(c) for c in body.iter_chunks(MIB))
        assert n == obj

    def pulsar():
        r = PulsarStyleReader(env.deps.bucket, ch)
        n = nbytes = 0
        for entry_id, data in r.iter_entries(0, led.entry_count - 1):
            assert entry_id == n
            n += 1
            nbytes += len(data)
        assert n == led.entry_count and nbytes == led.size_bytes, (n, nbytes)

    fns = [("ours", ours), ("ours_batches", ours_batches), ("raw_get", raw_get), ("pulsar_style", pulsar)]
    for r in range(runs):
        order = fns[r % 4:] + fns[:r % 4]  # rotate who goes first
        for name, fn in order:
            before = env.counter.snapshot()[0]
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            reqs[name].append(env.counter.snapshot()[0] - before)
    rate = {k: rnd(mib(obj) / median(v)) for k, v in times.items()}
    out = {"ledger_mib": size_mib, "object_mib": rnd(mib(obj), 2), "entries": led.entry_count, "runs": runs,
           "mib_s": rate, "requests": {k: median(v) for k, v in reqs.items()},
           "seconds": {k: [rnd(x, 3) for x in v] for k, v in times.items()},
           "ratio_ours_pulsar": rnd(rate["ours"] / rate["pulsar_style"], 2),
           "ratio_ours_raw": rnd(rate["ours"] / rate["raw_get"], 3),
           "ratio_batches_raw": rnd(rate["ours_batches"] / rate["raw_get"], 3),
           "ratio_pulsar_raw": rnd(rate["pulsar_style"] / rate["raw_get"], 3)}
    print(f"sequential read of {size_mib} MiB: ours {rate['ours']} MiB/s ({out['requests']['ours']} req), "
          f"Pulsar-style {rate['pulsar_style']} MiB/s ({out['requests']['pulsar_style']} req), raw GET "
          f"{rate['raw_get']} MiB/s, batches {rate['ours_batches']} MiB/s; ours/Pulsar {out['ratio_ours_pulsar']}, "
          f"ours/raw {out['ratio_ours_raw']}, batches/raw {out['ratio_batches_raw']}",
          flush=True)
    return out, (topic, led, ch)


def bench_small_scan(env: Env, count: int, size: int, runs: int, entry_size: int) -> dict:
    """A topic of `count` small offloaded ledgers read whole through `read_batches` (each ledger: its chunk
    row from the read's snapshot, its index and its data GET, the last two sent together, and sent while the
    ledger before is read), against the same read sending nothing ahead (`SEND_AHEAD_BELOW` 0) and against
    one ranged GET of each ledger's bytes in turn (the endpoint's floor for as many objects: no metadata, no
    index, no checks)."""
    from tiering import read as read_module

    topic, leds, paths = env.write_ledgers("small-scan", count, size, entry_size)
    offload_many(env.deps, leds)
    for led in env.deps.meta.list_ledgers(topic):
        env.deps.meta.mark_tier1_deleted(led)
    for path in paths:
        path.unlink()
    chunks = [env.deps.meta.get_chunk(led) for led in env.deps.meta.list_ledgers(topic)]
    total = sum(led.entry_count for led in leds)
    times = {"ours_batches": [], "not_ahead": [], "raw_gets": []}

    def ours_batches():
        pool = ThreadPoolExecutor(t2reader.READ_AHEAD, thread_name_prefix="bench-read")
        # the deployment's default GC delay: the read holds a snapshot of the chunk rows, as the CLI's does
        handle = ReadHandle(env.deps.meta, env.deps.tier1, tier2_opener(env.deps.bucket, ReaderCaches.new(), pool),
                            gc_delay_seconds=600)
        n = sum(len(batch.payloads) for batch in handle.read_batches(topic))
        pool.shutdown(wait=True)
        assert n == total, (n, total)

    def not_ahead():
        below, read_module.SEND_AHEAD_BELOW = read_module.SEND_AHEAD_BELOW, 0
        try:
            ours_batches()
        finally:
            read_module.SEND_AHEAD_BELOW = below

    def raw_gets():
        for ch in chunks:
            body = env.s3.get_object(Bucket=env.bucket, Key=ch.data_key,
                                     Range=f"bytes={ch.data_offset}-{ch.data_offset + ch.data_length - 1}")["Body"]
            assert sum(len(c) for c in body.iter_chunks(MIB)) == ch.data_length

    fns = [("ours_batches", ours_batches), ("not_ahead", not_ahead), ("raw_gets", raw_gets)]
    for r in range(runs):
        for name, fn in fns[r % 3:] + fns[:r % 3]:  # rotate who goes first
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: median(v) for k, v in times.items()}
    out = {"ledgers": count, "ledger_mib": rnd(mib(size), 2), "runs": runs,
           "ms": {k: rnd(v * 1000, 1) for k, v in med.items()}, "ratio_raw": rnd(med["raw_gets"] / med["ours_batches"], 3),
           "ratio_not_ahead": rnd(med["not_ahead"] / med["ours_batches"], 3)}
    print(f"scan of {count} ledgers of {out['ledger_mib']} MiB: read_batches {out['ms']['ours_batches']} ms, "
          f"sending nothing ahead {out['ms']['not_ahead']} ms ({out['ratio_not_ahead']}x), one ranged GET each "
          f"{out['ms']['raw_gets']} ms, ratio {out['ratio_raw']}", flush=True)
    return out


def bench_random(env: Env, target, n: int, entry_size: int) -> dict:
    topic, led, ch = target
    rng = random.Random(17)
    ids = [rng.randrange(led.entry_count) for _ in range(n)]
    res = {"ours": {"lat": [], "req": [], "bytes": []}, "pulsar_style": {"lat": [], "req": [], "bytes": []}}

    def ours(e):
        pool = ThreadPoolExecutor(t2reader.READ_AHEAD, thread_name_prefix="bench-rand")
        t0 = time.perf_counter()
        it = tier2_opener(env.deps.bucket, ReaderCaches.new(), pool)(led, ch).iter_entries(e, e)
        got = next(it)
        lat = time.perf_counter() - t0
        it.close()
        pool.shutdown(wait=True)  # requests already sent for read-ahead count against this read
        return got, lat

    def pulsar(e):
        t0 = time.perf_counter()
        it = PulsarStyleReader(env.deps.bucket, ch).iter_entries(e, e)
        got = next(it)
        lat = time.perf_counter() - t0
        it.close()
        return got, lat

    for k, e in enumerate(ids):
        order = [("ours", ours), ("pulsar_style", pulsar)]
        if k % 2:
            order.reverse()
        for name, fn in order:
            before = env.counter.snapshot()
            (eid, data), lat = fn(e)
            after = env.counter.snapshot()
            assert eid == e and data == payload(topic, e, entry_size), (name, e)
            res[name]["lat"].append(lat)
            res[name]["req"].append(after[0] - before[0])
            res[name]["bytes"].append(after[1] - before[1])
    out = {"reads": n, "object_mib": rnd(mib(ch.data_length), 2), "entries": led.entry_count}
    for name, r in res.items():
        lat = sorted(r["lat"])
        out[name] = {"median_ms": rnd(median(lat) * 1000, 1),
                     "p90_ms": rnd(lat[min(len(lat) - 1, int(0.9 * len(lat)))] * 1000, 1),
                     "requests_mean": rnd(statistics.mean(r["req"]), 2), "requests_median": median(r["req"]),
                     "requests_max": max(r["req"]), "mib_fetched_mean": rnd(mib(statistics.mean(r["bytes"])), 2)}
    out["ratio_latency"] = rnd(out["ours"]["median_ms"] / out["pulsar_style"]["median_ms"], 2)
    out["ratio_requests"] = rnd(out["ours"]["requests_mean"] / out["pulsar_style"]["requests_mean"], 2)
    out["ratio_bytes"] = rnd(out["ours"]["mib_fetched_mean"] / out["pulsar_style"]["mib_fetched_mean"], 2)
    print(f"random reads x{n}: ours median {out['ours']['median_ms']} ms, {out['ours']['requests_mean']} req, "
          f"{out['ours']['mib_fetched_mean']} MiB; Pulsar-style {out['pulsar_style']['median_ms']} ms, "
          f"{out['pulsar_style']['requests_mean']} req, {out['pulsar_style']['mib_fetched_mean']} MiB", flush=True)
    return out


# --------------------------------------------------------------------------------- case 4: peak RSS

def child_main(mode: str, args: dict) -> None:
    """Runs in a fresh process: set up, note the RSS, do one thing, report the peak (VmHWM)."""
    reuse_freed_buffers()  # as every product process that builds a bucket (tiering.clients.bucket)
    s3 = s3_client(args["endpoint"])
    engine = make_engine(args["db_url"])
    deps = Deps(MetadataStore(engine), Tier1Store(args["tier1_root"]), Bucket(s3, args["bucket"], PREFIX),
                Knobs(block_size=BLOCK_SIZE, upload_concurrency=CONCURRENCY, offload_timeout=timedelta(hours=1),
                      gc_delay=timedelta(0)))
    led = deps.meta.get_ledger(args["topic"], args["ledger_id"])
    s3.list_buckets()  # warm the client (its first request loads endpoint data and models)
    base = proc_status()
    t0 = time.perf_counter()
    nbytes, checkpoints = 0, []
    if mode == "offload":
        led = offload_ledger(deps, led)
        nbytes = led.size_bytes
    elif mode == "upload_file":
        s3.upload_file(args["path"], args["bucket"], args["key"], ExtraArgs=UPLOAD_EXTRA, Config=transfer_config())
        nbytes = os.path.getsize(args["path"])
    elif mode in ("read", "read_batches"):
        pool = ThreadPoolExecutor(t2reader.READ_AHEAD, thread_name_prefix="rss-read")
        handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, ReaderCaches.new(), pool))
        last = args.get("last_entry", led.entry_count - 1)
        step, mark = 64 * MIB, 64 * MIB
        if mode == "read":
            sizes = (len(item.data) for item in handle.read(args["topic"], end=Position(led.ledger_id, last)))
        else:
            sizes = (payload_bytes(batch.payloads)
                     for batch in handle.read_batches(args["topic"], end=Position(led.ledger_id, last)))
        for size in sizes:
            nbytes += size
            if nbytes >= mark:
                checkpoints.append([rnd(mib(nbytes)), rnd(mib(proc_status().get("VmHWM", 0)))])
                mark += step
        pool.shutdown(wait=True)
    elif mode == "raw_get":
        body = s3.get_object(Bucket=args["bucket"], Key=args["key"])["Body"]
        nbytes = sum(len(c) for c in body.iter_chunks(MIB))
    else:
        raise SystemExit(f"unknown child mode {mode}")
    seconds = time.perf_counter() - t0
    end = proc_status()
    engine.dispose()
    print(json.dumps({"mode": mode, "baseline_rss": base.get("VmRSS"), "baseline_hwm": base.get("VmHWM"),
                      "peak": end.get("VmHWM"), "bytes": nbytes, "seconds": seconds, "hwm_by_mib": checkpoints}))


def run_child(env: Env, mode: str, **kw) -> dict:
    args = {"endpoint": env.endpoint, "db_url": env.url, "bucket": env.bucket, "tier1_root": str(env.tier1_root), **kw}
    proc = subprocess.run([sys.executable, __file__, "--child", mode, json.dumps(args)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_rss(env: Env, size_mib: int, read_mib: int | None, entry_size: int) -> dict:
    topic, leds, paths = env.write_ledgers("rss", 1, size_mib * MIB, entry_size)
    led = leds[0]
    out = {"ledger_mib": size_mib, "bound_mib": mib(BLOCK_SIZE * (CONCURRENCY + 1)),
           "reader_inflight_mib": mib((t2reader.READ_AHEAD + 1) * t2reader.SCAN_GROUP), "server_rss_before": env.server_rss()}
    rows = {}
    rows["offload"] = run_child(env, "offload", topic=topic, ledger_id=led.ledger_id)
    out["server_rss_after_offload"] = env.server_rss()
    rows["upload_file"] = run_child(env, "upload_file", topic=topic, ledger_id=led.ledger_id, path=str(paths[0]),
                                    key="peer/rss")
    env.s3.delete_object(Bucket=env.bucket, Key="peer/rss")
    led = env.deps.meta.mark_tier1_deleted(env.deps.meta.get_ledger(topic, led.ledger_id))
    paths[0].unlink()
    ch = env.deps.meta.get_chunk(led)
    kw = {}
    if read_mib is not None and read_mib < size_mib:
        kw["last_entry"] = min(led.entry_count, (read_mib * MIB) // entry_size) - 1
    rows["read"] = run_child(env, "read", topic=topic, ledger_id=led.ledger_id, **kw)
    rows["read_batches"] = run_child(env, "read_batches", topic=topic, ledger_id=led.ledger_id, **kw)
    rows["raw_get"] = run_child(env, "raw_get", topic=topic, ledger_id=led.ledger_id, key=ch.data_key)
    out["server_rss_after_reads"] = env.server_rss()
    env.reset()
    for name, r in rows.items():
        r["peak_mib"] = rnd(mib(r["peak"]))
        r["baseline_mib"] = rnd(mib(r["baseline_rss"]))
        r["growth_mib"] = rnd(mib(r["peak"] - r["baseline_rss"]))
        r["mib_s"] = rnd(mib(r["bytes"]) / r["seconds"])
        r["mib"] = rnd(mib(r["bytes"]))
    out["children"] = rows
    for name, r in rows.items():
        print(f"peak RSS {name:<12} {r['peak_mib']:7.1f} MiB (baseline {r['baseline_mib']:.1f}, growth "
              f"{r['growth_mib']:.1f}; {r['mib']:.0f} MiB at {r['mib_s']:.1f} MiB/s)", flush=True)
    print(f"bound block x (concurrency+1) = {out['bound_mib']:.0f} MiB; server RSS {out['server_rss_after_reads']} MiB",
          flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer runs (~2 minutes)")
    ap.add_argument("--cases", default="1,2,3,4,5", help="which cases to run, e.g. 1,2")
    ap.add_argument("--entry-size", type=int, default=4096, help="payload bytes per entry (default 4096)")
    ap.add_argument("--rss-mib", type=int, help="ledger size for case 4 (default 1024, quick 128)")
    ap.add_argument("--rss-read-mib", type=int, help="read back only this many MiB in case 4 (default: all)")
    ap.add_argument("--private-moto", action="store_true",
                    help="start a moto server of our own instead of TIERING_S3_ENDPOINT_URL")
    ap.add_argument("--pin", action="store_true",
                    help="this checkout's Ceph daemons on CPU 0, the bench on the others (the client gets a core of "
                         "its own, as with a remote S3; benchkit.pinned)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--name", help="result file name without suffix (default tier2, tier2-quick with --quick)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "ARGS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args.child[0], json.loads(args.child[1]))
        return 0
    plan = dict(QUICK if args.quick else FULL)
    if args.rss_mib:
        plan["rss_mib"] = args.rss_mib
    if args.rss_read_mib:
        plan["rss_read_mib"] = args.rss_read_mib
    cases = {int(c) for c in args.cases.split(",")}
    with endpoint(args.private_moto) as url, pinned(url, args.pin) as pinning:
        return run(args, plan, cases, url, pinning)


def run(args, plan: dict, cases: set[int], url: str | None, pinning: str) -> int:
    env = Env(url)
    result = {"quick": args.quick, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(), "endpoint_kind": endpoint_kind(env, args.private_moto),
              "entry_size": args.entry_size, "block_size": BLOCK_SIZE, "concurrency": CONCURRENCY, "plan": plan,
              "pinning": pinning}
    result["loadavg_start"] = loadavg()
    result["server_rss_start"] = env.server_rss()
    t_start = time.perf_counter()
    try:
        if 1 in cases:
            result["offload"] = bench_offload(env, plan["offload"], args.entry_size)
        target = None
        if 2 in cases or 3 in cases:
            if 2 in cases:
                result["sequential"], target = bench_sequential(env, plan["read_mib"], plan["read_runs"],
                                                                args.entry_size)
                result["small_scan"] = bench_small_scan(env, 32, MIB, plan["read_runs"] + 6, args.entry_size)
            else:
                target = offload_one(env, "seq", plan["read_mib"] * MIB, args.entry_size)
            if 3 in cases:
                result["random"] = bench_random(env, target, plan["random_reads"], args.entry_size)
            env.reset()
        if 5 in cases:
            result["small"] = bench_small_ledgers(env, plan.get("small_ledgers", 1000), 16 * 1024, 4096)
        if 4 in cases:
            result["rss"] = bench_rss(env, plan["rss_mib"], plan["rss_read_mib"], args.entry_size)
        result["server_rss_end"] = env.server_rss()
    finally:
        env.close()
    result["seconds"] = rnd(time.perf_counter() - t_start)
    result["loadavg_end"] = loadavg()
    md = report(result) + f"Endpoint server ({env.server_name or 'not local'}) RSS (MiB) at start " \
                          f"{result['server_rss_start']}, at end {result['server_rss_end']}.\n\n"
    save(args.out, args.name or ("tier2-quick" if args.quick else "tier2"), result, md, "bench_tier2.py", args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
