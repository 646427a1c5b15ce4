"""Settings from the environment: required variables, validation, no secrets in repr or messages."""
import pytest

from tiering.config import Settings
from tiering.errors import ConfigError

BASE = {"TIERING_DATABASE_URL": "postgresql://u:s3cret@db:5432/t", "TIERING_BUCKET": "bkt",
        "TIERING_TIER1_ROOT": "/data/tier1"}


def test_defaults_and_values():
    s = Settings.from_env({**BASE, "TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
                           "AWS_SECRET_ACCESS_KEY": "topsecret"})
    assert s.prefix == "tiering/" and s.block_size == 64 * 1024 * 1024 and s.upload_concurrency == 4
    assert s.s3_endpoint_url == "http://127.0.0.1:9000"
    assert "s3cret" not in repr(s) and "topsecret" not in repr(s)
    assert s.database_url_safe == "postgresql://u:***@db:5432/t"


@pytest.mark.parametrize("missing", sorted(BASE))
def test_missing_variable_is_named(missing):
    env = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        Settings.from_env(env)


@pytest.mark.parametrize("var,value", [
    ("TIERING_DATABASE_URL", "mysql://x/y"),
    ("TIERING_DATABASE_URL", "postgresql://u:s3cret@h:notaport/db"),
    ("TIERING_S3_ENDPOINT_URL", "ftp://x"),
    ("TIERING_BLOCK_SIZE", "1024"),
    ("TIERING_BLOCK_SIZE", "lots"),
    ("TIERING_UPLOAD_CONCURRENCY", "0"),
    ("TIERING_PREFIX", "../escape/"),
    ("TIERING_BUCKET", "b"),
])
def test_malformed_variable_is_named_without_its_value(var, value):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({**BASE, var: value})
    assert var in str(err.value)
    assert "s3cret" not in str(err.value)


def test_prefix_gets_a_trailing_slash():
    assert Settings.from_env({**BASE, "TIERING_PREFIX": "logs"}).prefix == "logs/"


def test_to_env_round_trips():
    s = Settings.from_env({**BASE, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    assert Settings.from_env(s.to_env()) == s
