"""The metadata database's JDBC coordinates for Spark (export, `tiering-sql`): the user and password as
libpq takes them, from the URL's authority or its query, never in the JDBC URL itself."""
from __future__ import annotations

import pytest

from tiering.spark.sql import jdbc_url


@pytest.mark.parametrize("url, user, password", [
    ("postgresql://alice:s3cret@db.example:6543/meta", "alice", "s3cret"),
    ("postgresql://db.example/meta?user=alice&password=s3cret", "alice", "s3cret"),
    ("postgresql://alice@db.example/meta?password=first&password=s3cret", "alice", "s3cret"),
    ("postgresql://db.example/meta", "", ""),
])
def test_user_and_password_come_from_the_authority_or_the_query(url, user, password):
    jdbc, got_user, got_password = jdbc_url(url)
    assert (got_user, got_password) == (user, password)
    assert jdbc.startswith("jdbc:postgresql://db.example:") and "s3cret" not in jdbc and "password" not in jdbc


def test_tls_parameters_carry_over_and_nothing_else():
    jdbc, _, _ = jdbc_url("postgresql://u:p@h/d?sslmode=verify-full&sslrootcert=/ca.pem&password=p&application_name=x")
    assert jdbc == "jdbc:postgresql://h:5432/d?sslmode=verify-full&sslrootcert=%2Fca.pem"


def test_server_options_carry_over_too():
    jdbc, _, _ = jdbc_url("postgresql://u:p@h/d?options=-c%20search_path%3Dextra%2Cpublic&sslmode=require")
    assert jdbc == "jdbc:postgresql://h:5432/d?sslmode=require&options=-c+search_path%3Dextra%2Cpublic"
