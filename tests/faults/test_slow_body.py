"""A body that arrives steadily but slower than its read's deadline allows: the read is cut at the deadline
and goes on from the byte reached, in pieces each under its own deadline, instead of asking for the same
range again until its tries are spent. Through a rate-limited TCP proxy in front of the run's RGW."""
from __future__ import annotations

import os

import boto3

from tests.faults.test_slow_link import KIB, link  # noqa: F401 - the fixture
from tiering.tier2.client import s3_client
from tiering.tier2.objects import Bucket, RangeStream


def test_a_body_slower_than_its_deadline_goes_on_from_the_byte_reached(link, s3_settings, bucket):  # noqa: F811
    body = os.urandom(256 * KIB)
    boto3.client("s3", **s3_settings).put_object(Bucket=bucket, Key="slow/body", Body=body)
    over = link(rate=40 * KIB, delay=0)  # 6.4 s for the body; its read's deadline: 1 s + 256 KiB at 64 KiB/s
    client = s3_client(endpoint_url=over.url, access_key=s3_settings["aws_access_key_id"],
                       secret_key=s3_settings["aws_secret_access_key"], session_token=None,
                       region=s3_settings["region_name"], ca_bundle=None, timeout_seconds=1)
    stream = RangeStream(Bucket(client, bucket, ""), "slow/body", 0, len(body))
    assert stream.read(len(body)) == body
    assert stream.resumed >= 1, "never cut: the test tested nothing"
