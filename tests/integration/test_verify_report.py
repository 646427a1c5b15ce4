"""`tiering verify` reports each problem once, and names what is wrong (a cause
repeated in a report hides the others)."""
from __future__ import annotations

import pytest

from tests.integration.helpers import MIB, entries, make_deps, produce
from tests.integration.test_cli import cli  # noqa: F401  (the fixture)
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.offload import offload_many


@pytest.mark.parametrize("tier1", ["kept", "dropped"])
def test_a_lost_shared_object_pair_is_one_problem_per_ledger(cli, db, s3_client, bucket, tier1_root, tier1):  # noqa: F811
    """Tier-1 copies kept: verify compares each tier-2 copy, and the first ledger of the pair was reported
    twice (its lost index as a page-index problem, then as its tier-2 copy's); dropped: read from tier 2."""
    deps = make_deps(db, s3_client, bucket, tier1_root, batch_small_bytes=8 * MIB)
    produce(deps, "lost", [entries(f"l{i}", 3, 100) for i in range(20)], open_tail=[b"tail"])
    report = offload_many(deps, deps.meta.list_ledgers("lost", [S.SEALED]))
    assert len(report.offloaded) == 20
    chunks = deps.meta.chunks("lost")
    assert len({c.data_key for c in chunks.values()}) == 1  # one object pair for the 20 ledgers
    for led in deps.meta.list_ledgers("lost", [S.OFFLOADED]) if tier1 == "dropped" else []:
        deps.tier1.delete("lost", led.ledger_id)
        deps.meta.mark_tier1_deleted(led)
    for key in (chunks[0].data_key, chunks[0].index_key):
        s3_client.delete_object(Bucket=bucket, Key=key)
    bad = cli("verify", "lost", "--json")
    assert bad.returncode == 1
    problems = bad.json["problems"]
    assert len(problems) == 20, problems  # not 21: ledger 0 was reported twice
    assert [p.split(":")[0] for p in problems] == [f"ledger {i}" for i in range(20)]
    assert bad.stderr.startswith("tiering: error: 20 check(s) of 'lost' failed; first: ledger 0: "), bad.stderr


def test_no_s3_credentials_are_named_as_such(cli, deps):  # noqa: F811
    # ledger 0 offloaded (verify reads it from tier 2), ledger 1 due for offload-by-age
    produce(deps, "nocred", [entries("n", 3, 100), entries("m", 3, 100)],
            TopicPolicy(offload_after_seconds=0, rollover_entries=10**9, rollover_bytes=2**40), open_tail=[b"t"])
    offload_many(deps, [deps.meta.get_ledger("nocred", 0)])
    deps.tier1.delete("nocred", 0)
    deps.meta.mark_tier1_deleted(deps.meta.get_ledger("nocred", 0))
    no_creds = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                "AWS_EC2_METADATA_DISABLED": "true"}
    for args in (("verify", "nocred"), ("offload-by-age",)):
        line = cli(*args, env=no_creds, unset=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                               "AWS_PROFILE")).one_line_error(1)
        assert "credentials" in line and "AWS_ACCESS_KEY_ID" in line, (args, line)
        assert "TIERING_S3_ENDPOINT_URL" not in line and "did not answer" not in line, (args, line)
