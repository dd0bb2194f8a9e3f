"""No credential record prints its secret: reprs end up in logs, tracebacks and incident excerpts."""

from __future__ import annotations

import time

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.lyceum.bucket import StoredCredentials
from glue.runs.store import RunStore
from glue.train.storage.credentials import FileCredentials

SECRET, TOKEN = "s3cr3t-MARKER-value", "t0ken-MARKER-value"


def test_no_credential_repr_holds_the_secret_or_token() -> None:
    now = time.time()
    records = [
        BucketCredentials("AKIA", SECRET, TOKEN, now),
        StoredCredentials("AKIA", SECRET, TOKEN, now + 900, now, "http://127.0.0.1:9", "b", "us-east-1"),
        FileCredentials("AKIA", SECRET, TOKEN, now),
    ]
    for rec in records:
        for text in (repr(rec), str(rec), f"{rec!r}"):
            assert SECRET not in text and TOKEN not in text, text
            assert "AKIA" in text  # the key id is not secret and helps tell credentials apart


def test_a_run_store_repr_holds_no_secret() -> None:
    store = RunStore(BucketInfo("http://127.0.0.1:9", "b", "us-east-1"), BucketCredentials("AKIA", SECRET, TOKEN), "r")
    assert SECRET not in repr(store) and TOKEN not in repr(store)


def test_a_run_store_renews_credentials_that_near_expiry() -> None:
    # A recovery can outlive STS credentials (15 min on Lyceum): the store must not keep the ones it began with.
    issued: list[BucketCredentials] = []

    def fresh() -> BucketCredentials:
        issued.append(BucketCredentials("AKIA2", SECRET, TOKEN, time.time() + 900))
        return issued[-1]

    info = BucketInfo("http://127.0.0.1:9", "b", "us-east-1")
    store = RunStore(info, BucketCredentials("AKIA1", SECRET, TOKEN, time.time() + 30), "r", refresh=fresh)
    client = store.s3
    assert len(issued) == 1 and store.creds.access_key == "AKIA2"
    assert store.s3 is client and len(issued) == 1  # fresh ones are kept until they near expiry too
    lasting = RunStore(info, BucketCredentials("AKIA1", SECRET), "r", refresh=fresh)  # no expiry: never renewed
    assert lasting.s3 is lasting.s3 and len(issued) == 1


def test_the_trainer_credentials_file_has_one_writer_and_one_reader(tmp_path) -> None:
    from glue.bucket_access import BucketCredentials
    from glue.train.storage.credentials import credentials_doc, credentials_from_file

    creds = BucketCredentials("AK", "SK-secret", "TOKEN", 1234.5)
    path = tmp_path / "c.json"
    path.write_bytes(credentials_doc(creds))
    back = credentials_from_file(str(path))
    got = (back.access_key, back.secret_key, back.session_token, back.expires_at)
    assert got == ("AK", "SK-secret", "TOKEN", 1234.5)
