

def test_the_json_language_names_counts_and_byte_amounts():
    from tiering.cli.output import check_document

    ok = {"command": "defrag", "topic": None, "bytes": 1, "planned_bytes": 2, "copied_server_side_bytes": 3,
          "ledger_count": 4, "lag_ledger_count": 5, "plan": [{"tier1_copy_count": 1}]}
    assert check_document(ok) == []
    bad = {"command": "defrag", "topic": None, "bytes_downloaded": 1, "lag_ledgers": 2,
           "plan": [{"tier1_copies": 3}], "deleted": 4}
    assert sorted(check_document(bad)) == [
        "bytes_downloaded is a byte amount not named bytes or *_bytes", "deleted is a count not named *_count",
        "lag_ledgers is a count not named *_count", "plan[0].tier1_copies is a count not named *_count"]
