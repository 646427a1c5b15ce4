"""spark-submit arguments are built by a pure function: assert them as lists."""
import pytest

from tiering.errors import BadInput
from tiering.jobs.spec import JOBS, spark_submit_args
from tiering.model import Position


def test_every_dag_of_the_design_is_there():
    assert sorted(JOBS) == sorted([
        "tiering_offload_by_age", "tiering_offload_by_size", "tiering_offload_prefix", "tiering_delete_lagged",
        "tiering_retention", "tiering_defrag", "tiering_gc", "tiering_gc_sweep", "tiering_metadata_export",
        "tiering_recover", "tiering_scrub", "tiering_table_sync",
        "tiering_table_maintenance"])
    assert JOBS["tiering_offload_prefix"].schedule is None and JOBS["tiering_recover"].schedule is None
    assert all(JOBS[d].application == "offload.py" for d in JOBS if "offload" in d)


@pytest.mark.parametrize("dag_id,kwargs,expected", [
    ("tiering_offload_by_age", {}, ["--by=age"]),
    ("tiering_offload_by_size", {"topic": "orders"}, ["--by=size", "--topic=orders"]),
    ("tiering_offload_prefix", {"topic": "orders", "position": "12:0"}, ["--prefix=orders", "--position=12:0"]),
    ("tiering_offload_prefix", {"topic": "-x --by=age", "position": "1:2"}, ["--prefix=-x --by=age", "--position=1:2"]),
    ("tiering_delete_lagged", {}, []),
    ("tiering_retention", {"topic": "a/../b"}, ["--topic=a/../b"]),
    ("tiering_gc", {}, []),
    ("tiering_gc_sweep", {}, []),
    ("tiering_metadata_export", {"dest": "s3://b/x"}, ["--dest=s3://b/x"]),
    # a switch: the bare flag when true, nothing when false or absent
    ("tiering_recover", {}, []),
    ("tiering_recover", {"check_pages": False}, []),
    ("tiering_recover", {"topic": "-x", "check_pages": True}, ["--topic=-x", "--check-pages"]),
    ("tiering_recover", {"dry_run": True}, ["--dry-run"]),
    ("tiering_recover", {"topic": "t", "check_pages": True, "dry_run": True},
     ["--topic=t", "--check-pages", "--dry-run"]),
    ("tiering_gc", {"dry_run": False}, []),
    ("tiering_gc", {"check_pages": False}, []),  # false is "not asked for", whatever the job
    # the scrub's repair step: off unless asked for
    ("tiering_scrub", {}, []),
    ("tiering_scrub", {"topic": "t", "repair": True}, ["--topic=t", "--repair"]),
    ("tiering_scrub", {"repair": False}, []),
    # GC's FAILED keys made due again first: only when asked for
    ("tiering_gc", {"retry_failed": True}, ["--retry-failed"]),
    ("tiering_gc", {"retry_failed": False}, []),
    ("tiering_gc", {"retry_failed": None}, []),
    # the offload DAGs' upload limit; 0 is a value (unlimited for this run), not "absent"
    ("tiering_offload_by_age", {"max_bytes_per_second": 8388608}, ["--by=age", "--max-bytes-per-second=8388608"]),
    ("tiering_offload_by_age", {"max_bytes_per_second": "8MiB"}, ["--by=age", "--max-bytes-per-second=8388608"]),
    # the form's "integer" field takes 8388608.0 (JSON numbers), so the plan does too
    ("tiering_offload_by_age", {"max_bytes_per_second": 8388608.0}, ["--by=age", "--max-bytes-per-second=8388608"]),
    ("tiering_offload_prefix", {"topic": "t", "position": "1:0", "max_bytes_per_second": 0},
     ["--prefix=t", "--position=1:0", "--max-bytes-per-second=0"]),
])
def test_args(dag_id, kwargs, expected):
    assert spark_submit_args(dag_id, **kwargs) == expected


@pytest.mark.parametrize("dag_id,kwargs", [
    ("tiering_offload_prefix", {"topic": "t"}),
    ("tiering_offload_prefix", {"topic": "t", "position": "12"}),
    ("tiering_offload_prefix", {"topic": "t", "position": "1:2; rm -rf /"}),
    ("tiering_offload_prefix", {"topic": "", "position": "1:2"}),
    ("tiering_offload_prefix", {"topic": "x" * 1025, "position": "1:2"}),
    ("tiering_gc", {"position": "1:2"}),
    ("tiering_gc_sweep", {"topic": "orders"}),
    ("tiering_retention", {"dest": "/tmp"}),
    # the export's destination, refused in the plan as the job would refuse it after starting Spark
    ("tiering_metadata_export", {"dest": "ftp://host/x"}),
    ("tiering_metadata_export", {"dest": "s3:///no-bucket"}),
    ("tiering_metadata_export", {"dest": "/tmp/a\x00b"}),  # would fail spark-submit's exec with a traceback
    ("tiering_metadata_export", {"dest": 5}),
    ("tiering_metadata_export", {"dest": "s3://[bkt/x"}),  # urlsplit's ValueError
    ("tiering_gc", {"check_pages": True}),
    ("tiering_recover", {"check_pages": "false"}),  # a string is not a switch: "false" would read as true
    ("tiering_recover", {"check_pages": 1}),
    ("tiering_offload_by_age", {"repair": True}),  # only the scrub repairs
    ("tiering_scrub", {"repair": "true"}),
    ("tiering_gc", {"retry_failed": "true"}),  # a string is not a switch
    ("tiering_gc", {"retry_failed": 1}),
    ("tiering_gc_sweep", {"retry_failed": True}),  # the sweep has no queue to retry
    ("tiering_retention", {"retry_failed": True}),
    ("tiering_gc", {"max_bytes_per_second": 5}),
    ("tiering_metadata_export", {"max_bytes_per_second": 0}),
    ("tiering_offload_by_age", {"max_bytes_per_second": -1}),
    ("tiering_offload_by_age", {"max_bytes_per_second": "8Q"}),
    ("tiering_offload_by_age", {"max_bytes_per_second": "-8M"}),
    ("tiering_offload_by_age", {"max_bytes_per_second": True}),
    ("tiering_offload_by_age", {"max_bytes_per_second": 8.5}),
    ("tiering_offload_by_age", {"max_bytes_per_second": float("nan")}),
    ("tiering_offload_by_age", {"max_bytes_per_second": float("inf")}),
    ("tiering_offload_by_age", {"max_bytes_per_second": 2.0**63}),
    ("nope", {}),
])
def test_bad_args_are_refused(dag_id, kwargs):
    with pytest.raises(BadInput):
        spark_submit_args(dag_id, **kwargs)


def test_job_parsers_read_back_what_the_builder_writes():
    from tiering.jobs.offload import build_parser

    args = build_parser().parse_args(spark_submit_args("tiering_offload_prefix", topic="-x", position="3:4"))
    assert (args.prefix, args.position, args.by) == ("-x", Position(3, 4), None)
    args = build_parser().parse_args(spark_submit_args("tiering_offload_by_size", topic="--by=age"))
    assert (args.by, args.topic) == ("size", "--by=age")


def test_gc_sweep_job_parser_defaults_to_the_documented_page_budget():
    from tiering.jobs.gc_sweep import build_parser
    from tiering.ops.gc import SWEEP_MAX_PAGES

    args = build_parser().parse_args(spark_submit_args("tiering_gc_sweep"))
    assert (args.max_pages, args.orphan_grace_seconds) == (SWEEP_MAX_PAGES, None) == (10_000, None)
    assert JOBS["tiering_gc_sweep"].schedule == "@daily" and not JOBS["tiering_gc_sweep"].planned_before_spark
    assert JOBS["tiering_gc"].planned_before_spark and JOBS["tiering_gc_sweep"].kind == "gc_sweep"


def test_gc_parser_reads_back_the_retry_of_failed_keys():
    from tiering.jobs.gc import build_parser

    assert build_parser().parse_args(spark_submit_args("tiering_gc", retry_failed=True)).retry_failed is True
    assert build_parser().parse_args(spark_submit_args("tiering_gc")).retry_failed is False
    with pytest.raises(BadInput, match="tiering_gc_sweep takes no retry of FAILED GC keys"):
        spark_submit_args("tiering_gc_sweep", retry_failed=True)


def test_recover_parser_reads_back_what_the_builder_writes():
    from tiering.jobs.recover import build_parser

    args = build_parser().parse_args(spark_submit_args("tiering_recover", topic="--check-pages", check_pages=True))
    assert (args.topic, args.check_pages) == ("--check-pages", True)
    args = build_parser().parse_args(spark_submit_args("tiering_recover", check_pages=False))
    assert (args.topic, args.check_pages, args.dry_run) == (None, False, False)
    args = build_parser().parse_args(spark_submit_args("tiering_recover", topic="--dry-run", dry_run=True))
    assert (args.topic, args.check_pages, args.dry_run) == ("--dry-run", False, True)


def test_a_dry_run_is_the_recovery_s_alone_and_a_switch():
    with pytest.raises(BadInput, match="tiering_gc takes no dry run"):
        spark_submit_args("tiering_gc", dry_run=True)
    with pytest.raises(BadInput, match="a switch is true or false"):
        spark_submit_args("tiering_recover", dry_run="false")  # "false" would be true
    with pytest.raises(TypeError, match="no run parameter named dryrun"):
        spark_submit_args("tiering_recover", dryrun=True)  # a caller's typo is not silently "not given"


def test_an_export_location_under_the_tier2_prefix_is_refused():
    # GC's orphan sweep deletes every object under the prefix that is not a ledger's: an export there is lost
    from tiering.model import check_export_location

    for url in ("s3://bkt/tiering/x", "s3a://bkt/tiering", "s3://bkt//tiering/x", " s3://bkt/tiering/ "):
        with pytest.raises(BadInput, match="under the tier-2 prefix 'tiering/'"):
            check_export_location(url, "bkt", "tiering/")
    for url in ("s3://bkt/tiering-metadata/x", "s3://other/tiering/x", "s3://bkt", "/tmp/x", "file:///tmp/x",
                "s3://bkt/tiering-tablesx/y", "s3://other/tiering-tables/x"):
        assert check_export_location(url, "bkt", "tiering/") == url


def test_an_export_location_among_the_iceberg_tables_is_refused():
    # table maintenance's orphan sweep deletes every file in a table's directory its snapshots do not name
    from tiering.model import check_export_location

    for url in ("s3://bkt/tiering-tables/ns/t1/backup", "s3://bkt/tiering-tables", "s3://bkt//tiering-tables/x"):
        with pytest.raises(BadInput, match="under the Iceberg tables' prefix 'tiering-tables/'"):
            check_export_location(url, "bkt", "tiering/")
    with pytest.raises(BadInput, match="under the Iceberg tables' prefix 'a/b-tables/'"):
        check_export_location("s3://bkt/a/b-tables/x", "bkt", "a/b/")


@pytest.mark.parametrize("url", [
    "s3://bkt/a\nb", "s3://bkt/a\tb", "s3://b\rkt/x", "/tmp/a\nb", "file:///tmp/a\tb",  # urlsplit drops \t\r\n
    "s3://bkt/backups#1", "s3://bkt/x?versionId=1", "s3://bkt/x?/../tiering/y",  # urlsplit cuts the key there
    "s3://AKIAXXXX:s3cr3t@bkt/x", "s3://bkt:443/x",  # not a bucket: pyarrow's error would echo the netloc
    "s3://bkt/../x", "s3://bkt/./tiering/x", "s3://bkt/a/../tiering",  # dot segments: normalised by some clients
    "s3://bkt/" + "k" * 1000,  # S3 keys are at most 1,024 bytes, the parts' names added
    "s3://bkt/a\udcffb", "/tmp/a\ud800",  # a lone surrogate (JSON conf can hold one)
])
def test_an_export_location_that_would_be_written_elsewhere_is_refused(url):
    # each of these was taken and written to another key than the one given (or failed at S3 with exit 1)
    from tiering.model import check_export_location

    with pytest.raises(BadInput) as exc:
        check_export_location(url, "bkt", "tiering/")
    assert "s3cr3t" not in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(BadInput):
        spark_submit_args("tiering_metadata_export", dest=url)


def test_the_forms_size_pattern_takes_every_unit_parse_size_takes():
    import re

    from tiering.units import SIZE_PATTERN, SIZE_UNITS, parse_size

    for unit in SIZE_UNITS:
        for text in (f"8{unit}", f"8 {unit.upper()}", f"1.5{unit.title()}"):
            matched = re.search(SIZE_PATTERN, text) is not None
            try:
                parse_size(text, "x", 0, 2**63 - 1)
                parsed = True
            except BadInput:
                parsed = False
            assert matched and (parsed or text.startswith("1.5")), text  # (1.5 B is no whole number of bytes)
    for bad in ("8 P", "8PiB", "8\n", "-1", "1e6", "8 MiB "):
        assert re.search(SIZE_PATTERN, bad) is None, bad
