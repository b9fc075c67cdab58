"""Writes the sample input files under data/ (deterministic: run it again, get the same bytes).

Each data set is a folder of small files, one micro-batch each when read with
``maxFilesPerTrigger = 1``. Spark's file source reads files in order of modification time, so
this script also sets each file's modification time to follow its name; ``--touch`` does only
that (``make run`` calls it, because a git checkout gives files arbitrary, often equal times).

Every data set holds real duplicates (re-sent copies), rows that arrive too late (expiry use
cases) and a few error rows (a null key or expiry value), so every output port gets rows.

    python data/make_samples.py            # rewrite every sample file
    python data/make_samples.py --touch    # only set the modification times in name order
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA_SETS = ("customers", "system-logs", "transactions", "cities", "cdc")
# 2024-01-01T00:00:00Z: a fixed base keeps the modification times reproducible.
MTIME_BASE = 1_704_067_200

Row = dict[str, Any]


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def write_jsonl(path: Path, rows: Iterable[Row]) -> None:
    text = "".join(json.dumps(row, separators=(", ", ": ")) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8")


def write_csv(path: Path, header: list[str], rows: Iterable[Row]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({name: "" if row.get(name) is None else row[name] for name in header})
    path.write_text(buffer.getvalue(), encoding="utf-8")


def shuffled_in(rng: random.Random, rows: list[Row], extra: list[Row]) -> list[Row]:
    """``rows`` in order with ``extra`` inserted at random places (re-sent copies, errors)."""
    out = list(rows)
    for row in extra:
        out.insert(rng.randint(len(out) // 4, len(out)), row)
    return out


# -- customers: Basic Dedup of master data on {name, phone} ----------------------------------

FIRST = ["Austin", "Bella", "Carlos", "Dana", "Elif", "Farah", "Goran", "Hana", "Ivan", "Jun"]
LAST = ["Saunders", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Rossi", "Novak", "Haddad"]
CITIES = [("Austin", "78701"), ("Boston", "02108"), ("Chicago", "60601"), ("Denver", "80202")]
CUSTOMER_HEADER = ["name", "phone", "email", "date", "city", "zip", "country"]


def customer(index: int) -> Row:
    first, last = FIRST[index % len(FIRST)], LAST[(index // len(FIRST)) % len(LAST)]
    city, zip_code = CITIES[index % len(CITIES)]
    moment = datetime(2015, 11, 9, 13, 38, 38) + timedelta(minutes=7 * index)
    return {
        "name": f"{first} {chr(65 + index % 26)}. {last}",
        "phone": f"+1-555-{1000 + index * 37 % 9000:04d}",
        "email": f"{first.lower()}.{last.lower()}{index}@example.com",
        "date": moment.strftime("%Y-%m-%d %H:%M:%S"),
        "city": city,
        "zip": zip_code,
        "country": "United States",
    }


def resent_customer(rng: random.Random, original: Row) -> Row:
    """The same customer (name and phone) entered again with another email and time."""
    copy = dict(original)
    copy["email"] = original["email"].replace("@", f"+{rng.randint(1, 99)}@")
    copy["date"] = (
        datetime.strptime(original["date"], "%Y-%m-%d %H:%M:%S") + timedelta(minutes=1)
    ).strftime("%Y-%m-%d %H:%M:%S")
    return copy


def customers(rng: random.Random) -> dict[str, list[Row]]:
    people = [customer(i) for i in range(190)]
    first, second, third = people[:70], people[70:140], people[140:]
    homonym = dict(first[3], phone="+1-555-0000", email="same.name.other.phone@example.com")
    files = {
        "customers-1.csv": shuffled_in(
            rng,
            first,
            [resent_customer(rng, p) for p in rng.sample(first, 5)]
            + [dict(first[10], phone=None), dict(first[11], name=None)],
        ),
        "customers-2.csv": shuffled_in(
            rng,
            second,
            [resent_customer(rng, p) for p in rng.sample(first, 8)]
            + [dict(first[0])]
            + [homonym, dict(second[5], phone=None)],
        ),
        "customers-3.csv": shuffled_in(
            rng,
            third,
            [resent_customer(rng, p) for p in rng.sample(first + second, 10)]
            + [dict(third[7], name=None, phone=None)],
        ),
    }
    return files


# -- system logs: tuple-time expiry of 24 hours on the log timestamp -------------------------

HOSTS = ["web-1", "web-2", "db-1", "queue-1"]
LEVELS = ["INFO", "INFO", "INFO", "WARN", "ERROR"]
MESSAGES = [
    "request served",
    "cache refreshed",
    "slow query",
    "connection reset by peer",
    "disk usage above 80%",
    "user session expired",
]


def log_row(rng: random.Random, serial: int | None, moment: datetime | None) -> Row:
    return {
        "serial": serial,
        "ts": iso(moment) if moment else None,
        "host": rng.choice(HOSTS),
        "level": rng.choice(LEVELS),
        "message": rng.choice(MESSAGES),
    }


def day_of_logs(
    rng: random.Random, first_serial: int, start: datetime, count: int, minutes: int
) -> list[Row]:
    step = minutes / count
    return [
        log_row(rng, first_serial + i, start + timedelta(minutes=round(i * step)))
        for i in range(count)
    ]


def system_logs(rng: random.Random) -> dict[str, list[Row]]:
    """Some 32 hours of logs in four files of a few hours each, with replays and late logs."""
    # The operator guide's example: with the latest point at 31-12-2014 00:00 and a period of
    # one day, a row stamped 30-12-2014 00:00 is expired, one stamped 30-12-2014 00:11 is checked.
    midnight30 = log_row(rng, 1, datetime(2014, 12, 30, 0, 0))
    eleven_past = log_row(rng, 2, datetime(2014, 12, 30, 0, 11))
    morning30 = [
        midnight30,
        eleven_past,
        *day_of_logs(rng, 3, datetime(2014, 12, 30, 0, 20), 88, 690),
    ]
    last_of_30 = log_row(rng, 181, datetime(2014, 12, 31, 0, 0))
    evening30 = [*day_of_logs(rng, 91, datetime(2014, 12, 30, 12, 0), 90, 710), last_of_30]
    night31 = day_of_logs(rng, 182, datetime(2014, 12, 31, 0, 5), 70, 350)
    morning31 = day_of_logs(rng, 252, datetime(2014, 12, 31, 6, 0), 40, 118)
    # A host that lagged a day: its logs are older than the period the first time they arrive.
    late = [log_row(rng, 800 + i, datetime(2014, 12, 29, 20, 7 * i)) for i in range(8)]
    bad_time = dict(log_row(rng, 900, None), ts="not-a-time")
    return {
        "2014-12-30T00.jsonl": shuffled_in(
            rng,
            morning30,
            [dict(r) for r in rng.sample(morning30[2:], 6)]
            + [log_row(rng, None, datetime(2014, 12, 30, 6, 0)), dict(morning30[5], serial=None)],
        ),
        "2014-12-30T12.jsonl": shuffled_in(
            rng,
            evening30,
            [dict(r) for r in rng.sample(morning30[2:], 10)]
            + [log_row(rng, None, datetime(2014, 12, 30, 18, 0)), bad_time],
        ),
        "2014-12-31T00.jsonl": shuffled_in(
            rng,
            night31,
            [dict(midnight30), dict(eleven_past), *late]
            + [dict(r) for r in rng.sample(evening30[:-1], 6)]
            + [log_row(rng, None, datetime(2014, 12, 31, 3, 0)), log_row(rng, 901, None)],
        ),
        "2014-12-31T06.jsonl": shuffled_in(
            rng,
            morning31,
            [dict(r) for r in rng.sample(night31, 6)]
            + [dict(r) for r in rng.sample(morning30[2:40], 5)]
            + [log_row(rng, None, datetime(2014, 12, 31, 7, 0))],
        ),
    }


# -- transactions: the transaction id is the key and an ordered expiry key (period 100) -------

ACCOUNTS = ["ACC-001", "ACC-002", "ACC-003", "ACC-004", "ACC-005"]


def txn(rng: random.Random, txn_id: int | None) -> Row:
    offset = (txn_id or 10_000) - 10_000
    return {
        "txn_id": txn_id,
        "account": rng.choice(ACCOUNTS),
        "amount": round(rng.uniform(1, 500), 2),
        "currency": rng.choice(["EUR", "USD"]),
        "created_at": iso(datetime(2016, 3, 1, 9, 0) + timedelta(seconds=37 * offset)),
    }


def transactions(rng: random.Random) -> dict[str, list[Row]]:
    first = [txn(rng, i) for i in range(10_001, 10_101)]
    second = [txn(rng, i) for i in range(10_101, 10_201)]
    third = [txn(rng, i) for i in range(10_201, 10_261)]
    # Replays: 10100 is exactly at the expiry point of batch 3 (expired), 10101 just above it.
    return {
        "batch-1.jsonl": shuffled_in(
            rng, first, [dict(r) for r in rng.sample(first, 5)] + [txn(rng, None), txn(rng, None)]
        ),
        "batch-2.jsonl": shuffled_in(
            rng, second, [dict(r) for r in rng.sample(first, 8)] + [txn(rng, None)]
        ),
        "batch-3.jsonl": shuffled_in(
            rng,
            third,
            [dict(first[-1]), dict(second[0])]
            + [dict(r) for r in rng.sample(first[:90], 5)]
            + [dict(r) for r in rng.sample(second[1:], 6)]
            + [txn(rng, None)],
        ),
    }


# -- cities: orders grouped by city, the city a categorical expiry key (period 2) -------------


def order(rng: random.Random, city: str | None, number: int, code: str | None = None) -> Row:
    prefix = (code or (city or "XXX")[:3]).upper()
    return {
        "order_id": f"{prefix}-{number:04d}",
        "city": city,
        "customer": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
        "amount": round(rng.uniform(5, 250), 2),
    }


def orders_of(rng: random.Random, city: str, count: int) -> list[Row]:
    return [order(rng, city, n) for n in range(1, count + 1)]


def cities(rng: random.Random) -> dict[str, list[Row]]:
    austin, boston = orders_of(rng, "Austin", 30), orders_of(rng, "Boston", 30)
    chicago, denver = orders_of(rng, "Chicago", 30), orders_of(rng, "Denver", 30)
    el_paso, fresno = orders_of(rng, "El Paso", 30), orders_of(rng, "Fresno", 30)
    houston = orders_of(rng, "Houston", 25)
    no_id = dict(order(rng, "Boston", 999), order_id=None)
    no_city = dict(order(rng, None, 998, code="CHI"))
    return {
        "part-1.jsonl": [*austin, *shuffled_in(rng, boston, [*rng.sample(boston, 3), no_id])],
        "part-2.jsonl": [
            *shuffled_in(rng, chicago, rng.sample(austin, 3) + rng.sample(boston, 3)),
            *shuffled_in(rng, denver, [no_city]),
        ],
        "part-3.jsonl": [
            *shuffled_in(rng, el_paso, rng.sample(austin, 3) + rng.sample(boston, 2)),
            *shuffled_in(rng, fresno, rng.sample(chicago, 4) + rng.sample(denver, 2)),
        ],
        "part-4.jsonl": shuffled_in(
            rng,
            houston,
            rng.sample(chicago, 3)
            + rng.sample(el_paso, 4)
            + rng.sample(fresno, 3)
            + [dict(order(rng, "Houston", 997), order_id=None)],
        ),
    }


# -- cdc: change events of three source databases, each with a growing log sequence number ---

SOURCES = ("orders-db", "billing-db", "users-db")
TABLES = {"orders-db": "orders", "billing-db": "invoices", "users-db": "users"}


def change(rng: random.Random, source: str, lsn: int | None) -> Row:
    return {
        "source": source,
        "lsn": lsn,
        "table": TABLES[source],
        "op": rng.choice(["insert", "update", "update", "delete"]),
        "row_key": rng.randint(1, 500),
    }


def cdc(rng: random.Random) -> dict[str, list[Row]]:
    """Each source's LSNs grow with gaps; a connector restart re-delivers a source's last
    changes (duplicates, in the same file and the next); a change without an LSN is an error."""
    lsns = {source: 1000 * (number + 1) for number, source in enumerate(SOURCES)}
    files: dict[str, list[Row]] = {}
    previous: list[Row] = []
    for number in range(1, 4):
        rows = []
        for source in SOURCES:
            for _ in range(25):
                lsns[source] += rng.choice([1, 1, 1, 2, 5])  # gaps: LSNs of other tables
                rows.append(change(rng, source, lsns[source]))
        replayed = [dict(r) for r in rng.sample(rows, 6) + rng.sample(previous or rows, 8)]
        out = shuffled_in(rng, rows, [*replayed, change(rng, rng.choice(SOURCES), None)])
        files[f"changes-{number}.jsonl"] = out
        previous = rows
    return files


def write_all() -> None:
    builders = {
        "customers": customers,
        "system-logs": system_logs,
        "transactions": transactions,
        "cities": cities,
        "cdc": cdc,
    }
    for name, build in builders.items():
        folder = HERE / name
        folder.mkdir(exist_ok=True)
        for stale in folder.iterdir():
            stale.unlink()
        for file_name, rows in build(random.Random(f"dedupsink-{name}")).items():
            if file_name.endswith(".csv"):
                write_csv(folder / file_name, CUSTOMER_HEADER, rows)
            else:
                write_jsonl(folder / file_name, rows)


def touch_in_name_order(root: Path = HERE) -> None:
    """Give each data set's files increasing modification times, in the order of their names."""
    for name in DATA_SETS:
        folder = root / name
        if not folder.is_dir():
            continue
        for index, path in enumerate(sorted(p for p in folder.iterdir() if p.is_file())):
            os.utime(path, (MTIME_BASE + index, MTIME_BASE + index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--touch", action="store_true", help="only set modification times in name order"
    )
    args = parser.parse_args()
    if not args.touch:
        write_all()
    touch_in_name_order()


if __name__ == "__main__":
    main()
