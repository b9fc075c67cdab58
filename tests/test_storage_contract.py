"""The contract of ``store/storage/`` on every supported filesystem family, against real servers.

Every test runs on the local disk, ``memory://``, S3 (moto's server), Azure Blob (Azurite) and
Google Cloud Storage (fake-gcs-server). The heart of it: eight writers (processes; threads for
``memory://``, which lives in one process) commit the same next store version at the same
moment, 200 rounds (60 through a server's HTTP API): exactly one wins each round, every other
gets a conflict, every writer's next listing shows the new version, and the store reads back
the winner's manifest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from racing import manifest_of, race
from servers import Azurite, FakeGcs, Remote, S3Server

from dedupsink.errors import DedupOptionError, StoreError
from dedupsink.store.storage import Storage
from dedupsink.store.store import BucketStore

FAMILIES = ["local", "memory", "s3", "azure", "gcs"]
WRITERS = 8
ROUNDS = 200
# Through a server's HTTP API a round of eight writers costs some 0.1 s (27 s for 200 on S3):
# 60 rounds there, 480 racing creates, keep the regular suite within its budget.
SERVER_ROUNDS = 60


@pytest.fixture(params=FAMILIES)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Remote]:
    """A fresh, empty location on one family's filesystem."""
    family = request.param
    if family == "local":
        yield Remote(str(tmp_path / "root"), {})
    elif family == "memory":
        yield Remote(f"memory://contract-{uuid.uuid4().hex}", {})
    else:
        server: S3Server | Azurite | FakeGcs = request.getfixturevalue(
            {"s3": "s3", "azure": "azure", "gcs": "gcs"}[family]
        )
        yield server.remote("contract")


def storage(location: Remote, **extra: Any) -> Storage:
    return Storage.for_url(location.url, {**location.storage_options, **extra})


def another_process(location: Remote) -> Storage:
    """A filesystem instance of its own, as another process would have."""
    return storage(location, skip_instance_cache=True)


def test_the_family_is_chosen_from_the_url(location: Remote) -> None:
    family = storage(location).family
    expected = {"file": "local", "memory": "memory", "s3": "s3", "abfs": "azure", "gs": "gcs"}
    scheme = location.url.partition("://")[0] if "://" in location.url else "file"
    assert family == expected[scheme]


def test_create_makes_a_new_object_whole_and_refuses_an_existing_one(location: Remote) -> None:
    fs = storage(location)
    path = fs.path("log", "000001.manifest")
    fs.create(path, b"first writer")
    assert another_process(location).read(path) == b"first writer"
    with pytest.raises(FileExistsError):
        fs.create(path, b"second writer")
    with pytest.raises(FileExistsError):
        another_process(location).create(path, b"third writer")
    assert fs.read(path) == b"first writer"
    assert [name for name in fs.entries(fs.path("log"))] == ["000001.manifest"]


def test_reads_and_listings_see_what_another_instance_wrote_since(location: Remote) -> None:
    mine, theirs = storage(location), another_process(location)
    folder = mine.path("data")
    mine.write(mine.path("data", "a"), b"a")
    assert set(mine.entries(folder)) == {"a"}
    assert not mine.exists(mine.path("data", "b"))
    theirs.write(theirs.path("data", "b"), b"bb")
    assert set(mine.entries(folder)) == {"a", "b"}
    assert mine.exists(mine.path("data", "b"))
    assert mine.entries(folder)["b"].size == 2
    theirs.write(theirs.path("data", "b"), b"bbb")
    assert mine.read(mine.path("data", "b")) == b"bbb"
    assert mine.entries(mine.path("nothing-here")) == {}


def test_a_listing_holds_the_files_directly_in_the_folder(location: Remote) -> None:
    fs = storage(location)
    fs.write(fs.path("log", "000001.manifest"), b"one")
    fs.write(fs.path("log", "deeper", "000002.manifest"), b"two")
    listed = fs.entries(fs.path("log"))
    assert list(listed) == ["000001.manifest"]
    entry = listed["000001.manifest"]
    assert (entry.name, entry.size) == ("000001.manifest", 3)
    assert fs.entries(fs.path("log", "000001.manifest", "not-a-folder")) == {}


def test_ranged_reads_return_the_bytes_asked_for(location: Remote) -> None:
    fs = storage(location)
    path = fs.path("data", "ranges")
    fs.write(path, bytes(range(256)) * 4)
    assert fs.read_range(path, 10, 20) == bytes(range(10, 20))
    view = memoryview(bytearray(16))
    assert fs.read_into(path, 1020, view) == 4  # a short read at the end
    assert bytes(view[:4]) == bytes(range(252, 256))
    # At or past the end, a read is short, not an error: a truncated window file is then named
    # by the length check of the store (StoreCorruptError), not by a bare 416 of the server.
    assert fs.read_range(path, 1024, 1040) == b""
    assert fs.read_into(path, 2000, view) == 0
    with pytest.raises(FileNotFoundError):
        fs.read(fs.path("data", "absent"))
    with pytest.raises(FileNotFoundError):
        fs.read_range(fs.path("data", "absent"), 0, 16)


def test_publish_makes_a_staged_file_readable_and_is_safe_to_repeat(location: Remote) -> None:
    fs = storage(location)
    staged, target = fs.path("_staging", "w1", "p0.parquet"), fs.path("unique", "part-1.parquet")
    fs.write(staged, b"rows")
    fs.publish(staged, target, 4)
    assert another_process(location).read(target) == b"rows"
    fs.publish(staged, target, 4)  # a publication redone after a crash
    fs.delete([staged])
    fs.publish(staged, target, 4)  # the source already gone: the target says it is done
    assert fs.read(target) == b"rows"
    with pytest.raises(StoreError, match="is gone"):
        fs.publish(fs.path("_staging", "w1", "lost.parquet"), fs.path("unique", "x.parquet"), 4)


def test_delete_removes_in_bulk_and_ignores_missing_files(location: Remote) -> None:
    fs = storage(location)
    paths = [fs.path("data", f"f{i}") for i in range(5)]
    for path in paths:
        fs.write(path, b"x")
    fs.delete([*paths[:3], fs.path("data", "never-written")])
    assert set(fs.entries(fs.path("data"))) == {"f3", "f4"}
    fs.discard_folder(fs.path("data"), paths[3:])
    assert fs.entries(fs.path("data")) == {}


def test_names_with_glob_characters_are_names_not_patterns(location: Remote) -> None:
    """A root may hold ``[``, ``*`` or ``?`` (``s3://bucket/team[a]/out``): deleting or
    publishing such a name, or deleting such a folder, touches it alone, never the names its
    pattern would match."""
    fs = storage(location)
    names = ["a[1]", "a1", "b*", "bc", "c?", "cd"]
    for name in names:
        fs.write(fs.path("data", name), name.encode())
    fs.publish(fs.path("data", "b*"), fs.path("published", "b*"), 2)
    assert set(fs.entries(fs.path("published"))) == {"b*"}
    fs.delete([fs.path("data", name) for name in ("a[1]", "b*", "c?")])
    assert set(fs.entries(fs.path("data"))) == {"a1", "bc", "cd"}
    assert fs.read(fs.path("published", "b*")) == b"b*"
    for folder in ("w[1]", "w1"):
        fs.write(fs.path("staging", folder, "part"), b"x")
    fs.delete_folder(fs.path("staging", "w[1]"))
    assert fs.find(fs.path("staging")) == [fs.path("staging", "w1", "part")]


def test_a_storage_travels_as_its_url_and_options(location: Remote) -> None:
    import pickle

    fs = storage(location)
    fs.write(fs.path("data", "x"), b"x")
    copy = pickle.loads(pickle.dumps(fs))
    assert (copy.url, copy.family) == (fs.url, fs.family)
    assert copy.read(copy.path("data", "x")) == b"x"


@pytest.mark.parametrize("family", ["s3", "azure", "gcs"])
def test_a_bucket_that_does_not_exist_is_an_option_error_naming_it(
    request: pytest.FixtureRequest, family: str
) -> None:
    server = request.getfixturevalue(family)
    scheme = {"s3": "s3", "azure": "abfs", "gcs": "gs"}[family]
    url = f"{scheme}://no-such-bucket-{uuid.uuid4().hex[:8]}/out"
    fs = Storage.for_url(url, server.storage_options, "storePath")
    with pytest.raises(DedupOptionError) as caught:
        fs.check_reachable("storePath")
    assert caught.value.option == "storePath"
    assert "does not exist" in str(caught.value) and url in str(caught.value)


def test_eight_writers_racing_for_each_version_leave_exactly_one_winner(location: Remote) -> None:
    store_url = f"{location.url}/race/_store"
    raced = ROUNDS if location.url.startswith(("memory://", "/")) else SERVER_ROUNDS
    outcomes = race(
        store_url,
        location.storage_options,
        WRITERS,
        raced,
        threads=location.url.startswith("memory://"),
    )
    assert sorted(outcomes) == list(range(WRITERS))
    errors = [o for rounds in outcomes.values() for o in rounds if o.startswith("error")]
    assert not errors, errors[:3]
    store = BucketStore(store_url, location.storage_options)
    assert store.versions()[-1] == raced
    for version in range(1, raced + 1):
        winners = [w for w, rounds in outcomes.items() if rounds[version - 1].startswith("won")]
        assert len(winners) == 1, f"version {version}: winners {winners}"
        assert store.read(version) == manifest_of(winners[0], version), f"version {version}"
    lost = sum(o.startswith("lost") for rounds in outcomes.values() for o in rounds)
    assert lost == (WRITERS - 1) * raced
