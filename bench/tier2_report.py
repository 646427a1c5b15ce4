"""The Markdown report of bench/bench_tier2.py's results (ratios of ours against each peer, in one table per
case), kept apart from the measuring code."""
from __future__ import annotations

from benchkit import BLOCK_SIZE, CONCURRENCY, mib


def report(result: dict) -> str:
    m = result["machine"]
    L = [f"# Tier-2 benchmark ({'quick' if result['quick'] else 'full'} run, {result['date']})", "",
         f"Machine: {m['cpus']} cores, Python {m['python']}, {m['platform']}; boto3 {m['boto3']}, "
         f"s3transfer {m['s3transfer']}. Endpoint: {result['endpoint_kind']}. Entries of {result['entry_size']} "
         f"bytes; block size {mib(BLOCK_SIZE):.0f} MiB, {CONCURRENCY} parts in flight. Ours and the peer run "
         "interleaved run by run (A B, B A, ...) on the same endpoint; medians; ratio = ours / peer (>1: ours faster, "
         "except where a row says otherwise). Load average (1/5/15 min) at start "
         f"{result['loadavg_start']}, at end {result['loadavg_end']}: other work on the machine adds noise. "
         f"CPUs: {result.get('pinning', 'not pinned')}.", ""]
    if "offload" in result:
        L += ["## 1. Offload throughput (MiB/s of ledger payload)", "",
              "Ours: `offload_many` as the CLI and the job run it: ledgers under 8 MiB of a topic as one batch "
              "(one data and one index object), larger ones one after another (metadata transactions, multipart "
              "upload, CRC32C per part, index object with its page index). The 'without metadata' row is "
              "`upload_ledgers` per ledger (no batching). Peer: boto3 `upload_file` of the tier-1 file, one after another "
              "(s3transfer classic, same part size and concurrency, CRC32C). For several ledgers also one "
              "s3transfer TransferManager given all files at once.", "",
              "| case | ours | peer | ratio |", "|---|---:|---:|---:|"]
        for r in result["offload"]:
            case = f"{r['ledgers']} x {r['ledger_mib']} MiB ({r['runs']} runs)"
            L.append(f"| {case} vs upload_file | {r['ours_mib_s']} | {r['s3transfer_mib_s']} | {r['ratio']:.2f} |")
            L.append(f"| {case}, ours without metadata (`upload_ledgers` only) vs upload_file | "
                     f"{r['ours_s3_only_mib_s']} | {r['s3transfer_mib_s']} | {r['ratio_s3_only']:.2f} |")
            if "s3transfer_tm_mib_s" in r:
                L.append(f"| {case} vs TransferManager, all files at once | {r['ours_mib_s']} | "
                         f"{r['s3transfer_tm_mib_s']} | {r['ratio_tm']:.2f} |")
        L.append("")
    if "small" in result:
        sm = result["small"]
        L += [f"## 5. Offload of {sm['ledgers']} small ledgers of {sm['ledger_kib']} KiB", "",
              "Ours: `offload_many` (one batch: one data object, one index object, one begin and one commit "
              "transaction). Peer: `upload_file` of each tier-1 file.", "",
              "| case | ours | peer | ratio (ours faster if > 1) |", "|---|---:|---:|---:|",
              f"| PUT requests (PutObject + UploadPart) | {sm['ours_puts']} | {sm['peer_puts']} | |",
              f"| seconds | {sm['ours_s']} | {sm['peer_s']} | {sm['ratio']:.2f} |", ""]
    if "sequential" in result:
        s = result["sequential"]
        L += [f"## 2. Sequential catch-up read of a {s['ledger_mib']} MiB offloaded ledger (MiB/s of the "
              f"{s['object_mib']} MiB data object, {s['runs']} runs)", "",
              "Ours: ReadHandle over `tier2_opener` (a scan is one streaming GET read in ~1 MiB groups of whole pages in the reading thread, every page's CRC32C checked, each group's pages of one block parsed in one pass), "
              "`read` (one `Entry` per entry) and `read_batches` (an Arrow array per run of pages). "
              "Pulsar-style: one 1 MiB buffer, one ranged GET at a time, no read-ahead. Raw: one streaming GET of "
              "the whole object (`iter_chunks`), no parsing: the endpoint's ceiling.", "",
              "| case | ours | peer | ratio |", "|---|---:|---:|---:|",
              f"| vs Pulsar-style reader | {s['mib_s']['ours']} | {s['mib_s']['pulsar_style']} | "
              f"{s['ratio_ours_pulsar']:.2f} |",
              f"| vs raw streaming GET | {s['mib_s']['ours']} | {s['mib_s']['raw_get']} | {s['ratio_ours_raw']:.3f} |",
              f"| `read_batches` vs raw streaming GET | {s['mib_s'].get('ours_batches')} | {s['mib_s']['raw_get']} | "
              f"{s.get('ratio_batches_raw', float('nan')):.3f} |",
              f"| Pulsar-style vs raw streaming GET | {s['mib_s']['pulsar_style']} | {s['mib_s']['raw_get']} | "
              f"{s['ratio_pulsar_raw']:.3f} |",
              f"| S3 requests per read (ours / Pulsar-style / raw) | {s['requests']['ours']} | "
              f"{s['requests']['pulsar_style']} / {s['requests']['raw_get']} | |", "",
              ("On moto every ranged GET copies the whole object server-side, so a ranged read costs in proportion "
               "to the object's size times the number of requests; the ratio against the raw GET on the same "
               "endpoint shows how much of that is the endpoint." if result["endpoint_kind"].startswith("moto")
               else "A ranged GET costs a round trip plus its bytes here (as on S3), whatever the object's size."),
              ""]
    if "small_scan" in result:
        sc = result["small_scan"]
        L += [f"Whole-topic scan of {sc['ledgers']} offloaded ledgers of {sc['ledger_mib']} MiB ({sc['runs']} runs, "
              "medians): `read_batches` (a chunk row from the read's snapshot, an index GET and a data GET per "
              "ledger, the data GET sent beside the index's, both sent while the ledger before is read) against "
              "the same read sending nothing ahead, and against one ranged GET of each ledger's bytes in turn.", "",
              "| case | ours (ms) | peer (ms) | ratio |", "|---|---:|---:|---:|",
              f"| `read_batches` vs one ranged GET per ledger | {sc['ms']['ours_batches']} | {sc['ms']['raw_gets']} | "
              f"{sc['ratio_raw']:.3f} |"]
        if "not_ahead" in sc["ms"]:
            L += [f"| `read_batches` vs the same sending nothing ahead | {sc['ms']['ours_batches']} | "
                  f"{sc['ms']['not_ahead']} | {sc['ratio_not_ahead']:.3f} |"]
        L += [""]
    if "random" in result:
        r = result["random"]
        o, p = r["ours"], r["pulsar_style"]
        L += [f"## 3. Cold random entry reads ({r['reads']} entries of a {r['object_mib']} MiB object, fresh "
              "reader and caches per read, index fetch included)", "",
              "| case | ours | peer (Pulsar-style) | ratio (lower is better) |", "|---|---:|---:|---:|",
              f"| median latency (ms) | {o['median_ms']} | {p['median_ms']} | {r['ratio_latency']:.2f} |",
              f"| p90 latency (ms) | {o['p90_ms']} | {p['p90_ms']} | {o['p90_ms'] / p['p90_ms']:.2f} |",
              f"| S3 requests per read (mean) | {o['requests_mean']} | {p['requests_mean']} | "
              f"{r['ratio_requests']:.2f} |",
              f"| S3 requests per read (max) | {o['requests_max']} | {p['requests_max']} | |",
              f"| MiB asked for per read (mean) | {o['mib_fetched_mean']} | {p['mib_fetched_mean']} | "
              f"{r['ratio_bytes']:.2f} |", ""]
    if "rss" in result:
        x = result["rss"]
        c = x["children"]
        L += [f"## 4. Peak RSS, fresh process per row ({x['ledger_mib']} MiB ledger)", "",
              f"Bound for the offload: block size x (concurrency + 1) = {x['bound_mib']:.0f} MiB above the "
              f"process's baseline (RSS after imports and setup). The reader holds up to "
              f"{x['reader_inflight_mib']:.0f} MiB of checked groups ahead of the parser. Peak = VmHWM.", "",
              "| case | ours: peak / growth (MiB) | peer: peak / growth (MiB) | ratio of growth |",
              "|---|---:|---:|---:|"]
        for ours, peer, label in (("offload", "upload_file", "offload vs s3transfer upload_file"),
                                  ("read", "raw_get", "sequential read vs raw streaming GET"),
                                  ("read_batches", "raw_get", "`read_batches` vs raw streaming GET")):
            if ours not in c:
                continue
            a, b = c[ours], c[peer]
            ratio = a["growth_mib"] / b["growth_mib"] if b["growth_mib"] > 0 else float("nan")
            L.append(f"| {label} ({a['mib']:.0f} / {b['mib']:.0f} MiB) | {a['peak_mib']} / {a['growth_mib']} | "
                     f"{b['peak_mib']} / {b['growth_mib']} | {ratio:.2f} |")
        L += ["", f"Throughput in those processes: offload {c['offload']['mib_s']} MiB/s, upload_file "
              f"{c['upload_file']['mib_s']} MiB/s, read {c['read']['mib_s']} MiB/s, raw GET {c['raw_get']['mib_s']} "
              f"MiB/s. Reader's peak by MiB read: {c['read']['hwm_by_mib']}.", ""]
    return "\n".join(L) + "\n"
