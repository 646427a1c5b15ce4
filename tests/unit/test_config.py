"""Settings from the environment: required variables, validation, no secrets in repr or messages."""
import pytest

from tiering.config import Settings
from tiering.errors import ConfigError

BASE = {"TIERING_DATABASE_URL": "postgresql://u:s3cret@db:5432/t", "TIERING_BUCKET": "bkt",
        "TIERING_TIER1_ROOT": "/data/tier1"}


def test_defaults_and_values():
    s = Settings.from_env({**BASE, "TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
                           "AWS_SECRET_ACCESS_KEY": "topsecret"})
    assert s.prefix == "tiering/" and s.block_size == 8 * 1024 * 1024 and s.upload_concurrency == 4
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
    ("TIERING_BUCKET", "Bad_Bucket!"),
    ("TIERING_PREFIX", ""),
    ("TIERING_PREFIX", "/"),
    ("TIERING_DATABASE_URL", "postgresql://u:s3cret@h:99999/db"),
    ("TIERING_DATABASE_URL", "postgresql://u:s3cret@[::1/db"),
    # each named itself: a malformed endpoint was reported as a malformed TIERING_DATABASE_URL by the CLI
    ("TIERING_S3_ENDPOINT_URL", "http://[::1"),
    ("TIERING_S3_ENDPOINT_URL", "http://127.0.0.1:99999"),  # failed as an unreachable endpoint (exit 1)
    ("AWS_DEFAULT_REGION", "bad region"),  # failed as "S3 is unreachable or misconfigured" (exit 1)
    ("AWS_DEFAULT_REGION", "-us"),
    ("TIERING_S3_TIMEOUT_SECONDS", "0"),  # botocore would take 0 as "no timeout"
    ("TIERING_S3_TIMEOUT_SECONDS", "2h"),
])
def test_malformed_variable_is_named_without_its_value(var, value):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({**BASE, var: value})
    assert var in str(err.value)
    assert "s3cret" not in str(err.value)


# Bytes that are not UTF-8 reach os.environ as lone surrogates (surrogateescape): a text setting holding
# them failed only where it was first encoded (a URL, a signed header) with exit 1 and a UnicodeEncodeError.
@pytest.mark.parametrize("var", ["TIERING_DATABASE_URL", "TIERING_PREFIX", "TIERING_S3_ENDPOINT_URL",
                                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                 "AWS_DEFAULT_REGION", "TIERING_S3_SSE_KMS_KEY_ID"])
def test_a_text_setting_that_is_not_utf8_is_named_without_its_value(var):
    env = {**BASE, "TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9000", "TIERING_S3_SSE": "aws:kms"}
    env[var] = (env.get(var) or "s3cret") + "\udcff"
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert str(err.value) == f"{var} is not valid UTF-8"
    from tiering.config import settings_present

    with pytest.raises(ConfigError, match=var):
        settings_present(env)


def test_a_path_setting_may_hold_bytes_that_are_not_utf8():
    # a file name is bytes on Linux: os.fsencode gives the same bytes back
    assert Settings.from_env({**BASE, "TIERING_TIER1_ROOT": "/data/t\udcff"}).tier1_root.name == "t\udcff"


@pytest.mark.parametrize("prefix", ["a/./b/", "./x", "x/.", "a//b/", "x//", "a\nb/", "x\t"])
def test_a_prefix_pyarrow_cannot_address_is_refused(prefix):
    # boto3 wrote such keys, but pyarrow (exports beside the prefix, Iceberg tables) cannot reach them: "./"
    # fails S3's signature (ACCESS_DENIED), "//" is "Empty path component"; a control character is a key
    # that prints as two lines
    with pytest.raises(ConfigError, match="TIERING_PREFIX"):
        Settings.from_env({**BASE, "TIERING_PREFIX": prefix})


def test_a_tier1_root_too_long_for_the_filesystem_is_a_setting_error(tmp_path):
    # stat() raised ENAMETOOLONG out of Path.exists(): "OSError: [Errno 36]" with exit 1
    with pytest.raises(ConfigError, match="TIERING_TIER1_ROOT"):
        Settings.from_env({**BASE, "TIERING_TIER1_ROOT": str(tmp_path / ("a" * 300) / "t1")})


def test_a_ca_bundle_path_too_long_for_the_filesystem_is_a_setting_error(tmp_path):
    # is_file() raised ENAMETOOLONG: "OSError: [Errno 36]" with exit 1, the path in the message
    with pytest.raises(ConfigError, match="TIERING_S3_CA_BUNDLE"):
        Settings.from_env({**BASE, "TIERING_S3_ENDPOINT_URL": "https://s3.example:443",
                           "TIERING_S3_CA_BUNDLE": str(tmp_path / ("a" * 300))})


def test_prefix_gets_a_trailing_slash():
    assert Settings.from_env({**BASE, "TIERING_PREFIX": "logs"}).prefix == "logs/"


def test_to_env_round_trips():
    s = Settings.from_env({**BASE, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    assert Settings.from_env(s.to_env()) == s


# ---- encryption and TLS settings -----------------------------------------------------------------------
def test_sse_c_key_comes_from_a_file_and_never_shows(tmp_path):
    import base64

    key = bytes(range(100, 132))
    raw, b64 = tmp_path / "raw.key", tmp_path / "b64.key"
    raw.write_bytes(key)
    b64.write_text(base64.b64encode(key).decode() + "\n")
    for path in (raw, b64):
        s = Settings.from_env({**BASE, "TIERING_S3_SSE_C_KEY_FILE": str(path)})
        assert s.s3_sse_c_key == key and s.s3_encryption.mode == "SSE-C"
        for shown in (repr(s), repr(s.s3_encryption), str(s.to_env())):
            assert key.hex() not in shown and base64.b64encode(key).decode() not in shown and str(key) not in shown
        assert s.to_env()["TIERING_S3_SSE_C_KEY_FILE"] == str(path)  # the path travels, the key never
        assert Settings.from_env(s.to_env()).s3_sse_c_key == key


@pytest.mark.parametrize("content", [b"short", b"x" * 33, b"not base64 at all, and not 32 bytes!!"])
def test_a_bad_sse_c_key_file_is_named_without_its_content(tmp_path, content):
    path = tmp_path / "k"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="TIERING_S3_SSE_C_KEY_FILE must hold a 32-byte key") as err:
        Settings.from_env({**BASE, "TIERING_S3_SSE_C_KEY_FILE": str(path)})
    assert content.decode() not in str(err.value)
    with pytest.raises(ConfigError, match="TIERING_S3_SSE_C_KEY_FILE cannot be read"):
        Settings.from_env({**BASE, "TIERING_S3_SSE_C_KEY_FILE": str(tmp_path / "missing")})


def test_an_sse_c_key_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    # a fifo blocked every command forever in open(); /dev/zero was read until MemoryError
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = {}

    def read(path):
        try:
            Settings.from_env({**BASE, "TIERING_S3_SSE_C_KEY_FILE": str(path)})
        except ConfigError as exc:
            result[path] = str(exc)

    for path in (fifo, "/dev/zero"):
        reader = threading.Thread(target=read, args=(path,), daemon=True)
        reader.start()
        reader.join(10)
        if reader.is_alive():  # release the blocked open() so the test process can end
            with open(fifo, "wb"):
                pass
        assert "TIERING_S3_SSE_C_KEY_FILE is not a regular file" in result.get(path, "blocked")


@pytest.mark.parametrize("env,message", [
    ({"TIERING_S3_SSE": "aes"}, "TIERING_S3_SSE must be one of none, AES256, aws:kms"),
    ({"TIERING_S3_SSE_KMS_KEY_ID": "k1"}, "TIERING_S3_SSE_KMS_KEY_ID is set but TIERING_S3_SSE is not aws:kms"),
    ({"TIERING_S3_CA_BUNDLE": "/nonexistent/ca.pem"}, "TIERING_S3_CA_BUNDLE is not a readable file"),
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret@db/t?sslmode=strict"}, "sslmode must be one of"),
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret@db/t?options=-c%20a%3D1&options=-c%20b%3D2"},
     "TIERING_DATABASE_URL gives options more than once"),
    ({"TIERING_DATABASE_URL": "postgresql://u@db/t?sslmode=require&sslmode=disable&password=s3cret&password=x"},
     "TIERING_DATABASE_URL gives password, sslmode more than once: give each parameter once"),
    # psycopg2 passed these on: each command then failed at its first connection (exit 1) with a bare
    # ValueError, or with libpq's text, which quotes the value
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret@db/t?connect_timeout=abc"}, "connect_timeout must be a whole"),
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret@db/t?keepalives_idle=1.5"}, "keepalives_idle must be a whole"),
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret@db/t?foo=bar"}, "a parameter libpq does not know: foo"),
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret@db/t?port=99999"}, "port must be a whole number from 1"),
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret@db/t?host=a,b&port=5432,x"}, "port must be a whole number"),
    ({"TIERING_DATABASE_URL": "postgresql://u:s3cret%00x@db/t"}, "not a URL libpq accepts"),
    ({"TIERING_DATABASE_URL": "postgresql://u@db/t?password=s3cret%00"}, "not a URL libpq accepts"),
    ({"TIERING_DATABASE_URL": "postgresql://u@db/t?sslmode=%zzs3cret"}, "not a URL libpq accepts"),
])
def test_bad_encryption_and_tls_settings_are_named(env, message):
    with pytest.raises(ConfigError, match=message) as err:
        Settings.from_env({**BASE, **env})
    assert "s3cret" not in str(err.value)


def test_sse_modes_and_ca_bundle(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    s = Settings.from_env({**BASE, "TIERING_S3_SSE": "AWS:KMS", "TIERING_S3_SSE_KMS_KEY_ID": "alias/tiering",
                           "TIERING_S3_ENDPOINT_URL": "https://rgw:8443", "TIERING_S3_CA_BUNDLE": str(ca)})
    assert (s.s3_sse, s.s3_encryption.kms_key_id, s.s3_ca_bundle) == ("aws:kms", "alias/tiering", ca)
    assert Settings.from_env(s.to_env()) == s
    # a CA bundle means TLS is expected: an http endpoint with it is refused, never used in plain text
    with pytest.raises(ConfigError, match="TIERING_S3_ENDPOINT_URL is not an https:// URL"):
        Settings.from_env({**BASE, "TIERING_S3_ENDPOINT_URL": "http://rgw:8080", "TIERING_S3_CA_BUNDLE": str(ca)})


def test_database_tls_parameters_are_kept_and_secrets_masked():
    url = "postgresql://u:s3cret@db:5432/t?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslpassword=keypass"
    s = Settings.from_env({**BASE, "TIERING_DATABASE_URL": url})
    assert s.database_url == url and Settings.from_env(s.to_env()).database_url == url
    assert s.database_url_safe == "postgresql://u:***@db:5432/t?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslpassword=***"
    from tiering.database_url import database_ssl_params

    assert database_ssl_params(url) == {"sslmode": "verify-full", "sslrootcert": "/etc/ca.pem"}


def test_the_export_never_writes_through_pyarrows_filesystem_with_encryption_on():
    # pyarrow's S3FileSystem sends no server-side encryption header: with encryption on, the export's
    # filesystem must be the one over the product's boto3 client
    import pyarrow.fs as pafs

    from tiering.tier2.arrowfs import Boto3Handler, s3_filesystem

    for env in ({"TIERING_S3_SSE": "aws:kms"}, {"TIERING_S3_SSE": "AES256"}):
        fs = s3_filesystem(Settings.from_env({**BASE, **env}), region="us-east-1")
        assert isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, Boto3Handler)
    assert isinstance(s3_filesystem(Settings.from_env(BASE), region="us-east-1"), pafs.S3FileSystem)


def test_pickled_settings_carry_the_key_file_not_the_key(tmp_path):
    import pickle

    key = bytes(range(7, 39))
    (tmp_path / "k").write_bytes(key)
    s = Settings.from_env({**BASE, "TIERING_S3_SSE_C_KEY_FILE": str(tmp_path / "k")})
    blob = pickle.dumps(s)
    assert key not in blob
    there = pickle.loads(blob)
    assert there.s3_sse_c_key == key  # read again where unpickled
    # everything else but the secrets (tests/unit/test_closure_secrets.py) arrives as it was
    assert there == s.with_(database_url=there.database_url, aws_access_key_id=None, aws_secret_access_key=None,
                            aws_session_token=None)


def test_reuse_freed_buffers_keeps_freed_blocks_for_the_next_ones():
    """In a fresh interpreter, four 8 MiB blocks are built, freed and built again (an offload's parts in
    flight). glibc's defaults hand the freed blocks back to the kernel, so building them again faults every
    page in anew; tuned, they come back from the heap without a page fault."""
    import subprocess
    import sys

    probe = (
        "import resource, sys\n"
        "from tiering.config import reuse_freed_buffers\n"
        "tuned = sys.argv[1] == 'tuned' and reuse_freed_buffers() and reuse_freed_buffers()\n"
        "faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(3):\n"
        "    held = [b'x' * (8 << 20) for _ in range(4)]; del held\n"
        "before = faults(); held = [b'x' * (8 << 20) for _ in range(4)]\n"
        "print(tuned, faults() - before)\n")

    def run(mode):
        tuned, faults = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True,
                                       check=True).stdout.split()
        return tuned, int(faults)
    assert run("default")[1] > 4 * 1000  # 4 x 8 MiB of 4 KiB pages faulted in again
    tuned, faults = run("tuned")
    assert tuned == "True" and faults < 100


def test_the_s3_timeout_reaches_the_client():
    from tiering.tier2.client import make_client

    settings = Settings.from_env({**BASE, "TIERING_S3_TIMEOUT_SECONDS": "5s"})
    config = make_client(settings).meta.config
    assert settings.s3_timeout_seconds == 5 and (config.connect_timeout, config.read_timeout) == (5, 5)
    config = make_client(Settings.from_env(BASE)).meta.config
    assert (config.connect_timeout, config.read_timeout) == (60, 60)


def test_the_s3_timeout_reaches_the_export_s_filesystem_and_its_boto3_requests():
    from tiering.tier2.arrowfs import _client_of, s3_filesystem

    settings = Settings.from_env({**BASE, "TIERING_S3_TIMEOUT_SECONDS": "7"})
    fs = s3_filesystem(settings, region="us-east-1", endpoint_override="127.0.0.1:9", scheme="http")
    options = fs.__reduce__()[1][0]
    assert (options["connect_timeout"], options["request_timeout"]) == (7, 7)
    config = _client_of(fs).meta.config  # the manifest's conditional PUT, the listing of uploads
    assert (config.connect_timeout, config.read_timeout) == (7, 7)
