"""Sequence dedup (``sequenceKey``) against the key mode on the same stream: rows/s and state.

Input (generated once, seeded, cached under ``bench/.data/``): 2,000,000 rows in 40 Parquet
files from 10,000 producers, with columns ``producer`` (a string, ``device-00042``), ``seq``
(int64: each producer's own increasing ids from a random start, 2% of steps skipping 1 to 50
ids), ``event_id`` (the string ``<producer>-<seq>``, unique per original row) and ``payload``
(~80 characters). Producers send at lognormal rates (the 90th percentile's about 3.6 times the
10th's). Within a window (two files) about 3% of a producer's consecutive rows are swapped, so
some ids arrive out of order, but never across windows. 10% of the rows are re-sends, exact
copies of an earlier row: 9% of a row from the previous ~5,000 rows, 1% of a row two to seven
windows back. The generator knows the truth: the first copy of each (producer, seq) is its
unique row, and it checks that the sequence rules (docs/SEMANTICS.md, "Sequence dedup") agree:
every first copy's id is above its producer's highest id of earlier windows, every re-send's
is not or its original is in the same window.

Spark variants, each streamed with ``local[2]``, ``maxFilesPerTrigger=2`` (20 micro-batches of
100,000 rows) and ``trigger(availableNow=True)``:

* ``sequence``: ``keys=producer``, ``sequenceKey=seq``: one entry per producer;
* ``keys``: ``keys=event_id``, Basic Dedup (no expiry): one entry per unique row;
* ``keys-pair``: ``keys=producer,seq``, Basic Dedup: the same keys as two columns.

``engine-sequence`` and ``engine-keys`` run the same options through the sink's own code in
one process without Spark (``LocalSink``: one task per input file, as Spark gives a window's
two files to two tasks, then the commit), the Parquet files read before the clock starts:
what the sink costs apart from Spark's transport, split into tasks (of which classification)
and commits (in sequence dedup the commit folds every touched bucket: ``fold_producers``).

Every run is a fresh Python process (this script with ``--variant``), the variants interleaved
and the round repeated (``--repeats``, three by default). Per run: wall time from
``writeStream...start()`` to the return of ``awaitTermination()`` (engine variants: the first
task to the last commit), rows/s, CPU seconds of the process tree, the ports against the truth,
and the store:

* live bytes: the window files the latest manifest references (``BucketStore.read()``, the sum
  of ``WindowFile.nbytes`` over ``manifest.files``), divided by the producers of the input;
* on disk: every file under ``_store`` (manifests of up to 16 versions, window files dropped
  from the index but not yet collected, which happens every 16 versions), divided likewise;
* growth: the live bytes and remembered entries of the manifests after windows 5, 10, 15 and 20
  (``BucketStore.read(version)``: version N is the store after window N).

The last line is machine-readable: ``ratio_sequence_vs_keys=<x>``, the median over the rounds of
``sequence``'s rows/s over ``keys``'s in the same round.
Usage: ``python bench/sequence.py [--repeats N] [--variants a,b] [--rows N] [--files N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    DATA_DIR,
    RESULT_PREFIX,
    CompareSpec,
    LoadSampler,
    TreeSampler,
    cached_input,
    code_revision,
    dir_bytes,
    local_session_builder,
    median,
    plan_rows,
    print_machine,
    random_text,
    run_child,
    run_main,
    time_stream,
    write_parquet_files,
)
from compare import compile_bytecode

SINK_OPTIONS = {
    "sequence": {"keys": "producer", "sequenceKey": "seq"},
    "keys": {"keys": "event_id"},
    "keys-pair": {"keys": "producer,seq"},
}
ENGINE = "engine-"
VARIANTS = (*SINK_OPTIONS, *(ENGINE + v for v in SINK_OPTIONS))
DEFAULT_VARIANTS = ("sequence", "keys", "keys-pair", "engine-sequence", "engine-keys")
PORTS = ("unique", "duplicate", "expired", "error")
GROWTH_WINDOWS = (5, 10, 15, 20)


# -- the input -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceSpec:
    rows: int = 2_000_000
    files: int = 40
    producers: int = 10_000
    recent_fraction: float = 0.09  # re-sends of a row within the previous resend_within rows
    resend_within: int = 5_000
    old_fraction: float = 0.01  # re-sends of a row old_min_windows to old_max_windows back
    old_min_windows: float = 2.0
    old_max_windows: float = 7.0
    gap_fraction: float = 0.02  # steps that skip ids
    max_gap: int = 50
    swap_fraction: float = 0.03  # consecutive rows of a producer in a window swapped
    seed: int = 20261127

    @property
    def key(self) -> str:
        return (
            f"sequence-r{self.rows}-f{self.files}-p{self.producers}-s{self.seed}"
            f"-d{self.recent_fraction + self.old_fraction:g}"
        )


def plan_stream(
    spec: SequenceSpec, rng: np.random.Generator, window_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Which original row every position holds, and its kind (0 original, 1 and 2 re-sends).

    ``common.plan_rows`` places the re-sends; it measures ages in seconds of event time at
    ``rows_per_second``, so at one row a second its "very late" ages are row counts."""
    plan = CompareSpec(
        rows=spec.rows,
        files=spec.files,
        rows_per_second=1.0,
        resend_fraction=spec.recent_fraction,
        resend_within=spec.resend_within,
        late_fraction=spec.old_fraction,
        late_min_age_s=spec.old_min_windows * window_rows,
        late_max_age_s=spec.old_max_windows * window_rows,
        seed=spec.seed,
    )
    source, kind, _ = plan_rows(plan, rng)
    return source, kind


def sequence_ids(
    spec: SequenceSpec, rng: np.random.Generator, producer: np.ndarray, windows: np.ndarray
) -> tuple[np.ndarray, int]:
    """Each original row's id: per producer increasing from a random start with occasional
    gaps, then some consecutive rows of a producer within one window swapped. Returns the ids
    and the number of swaps."""
    order = np.argsort(producer, kind="stable")  # by producer, each in stream order
    owner = producer[order]
    steps = 1 + np.where(
        rng.random(len(order)) < spec.gap_fraction, rng.integers(1, spec.max_gap + 1, len(order)), 0
    )
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = owner[1:] != owner[:-1]
    total = np.cumsum(steps)
    first = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    base = rng.integers(0, 1_000_000, spec.producers)
    ids = total - total[first] + steps[first] + base[owner]
    swap = (owner[1:] == owner[:-1]) & (windows[order][1:] == windows[order][:-1])
    swap &= rng.random(len(swap)) < spec.swap_fraction
    swap[1:] &= ~swap[:-1]  # disjoint pairs
    at = np.flatnonzero(swap)
    ids[at], ids[at + 1] = ids[at + 1], ids[at].copy()
    out = np.empty(len(order), dtype=np.int64)
    out[order] = ids
    return out, len(at)


def check_sequence_rules(
    producer: np.ndarray,
    ids: np.ndarray,
    kind: np.ndarray,
    source_window: np.ndarray,
    window_rows: int,
) -> dict[str, int]:
    """Apply the sequence rules to the stream and assert they agree with "the first copy is
    unique"; returns how the re-sends fall (same window as their original, or later)."""
    window = np.arange(len(ids)) // window_rows
    count = int(window.max()) + 1
    table = np.full((int(producer.max()) + 1, count), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(table, (producer, window), ids)
    before = np.full_like(table, np.iinfo(np.int64).min)
    before[:, 1:] = np.maximum.accumulate(table, axis=1)[:, :-1]
    highest = before[producer, window]
    first = kind == 0
    assert (ids[first] > highest[first]).all(), "an original would be below its producer's id"
    copies = ~first
    same_window = source_window[copies] == window[copies]
    assert (same_window | (ids[copies] <= highest[copies])).all(), "a re-send would be unique"
    return {
        "resends_same_window": int(same_window.sum()),
        "resends_later": int((~same_window).sum()),
    }


def generate_input(spec: SequenceSpec, window_files: int) -> tuple[Path, dict[str, Any]]:
    """The input directory (cached under ``bench/.data``) and its truth; ``truth.json`` is
    written last, so a directory without it is rebuilt."""
    root = DATA_DIR / spec.key
    truth_path = root / "truth.json"
    rows_per_file = -(-spec.rows // spec.files)
    window_rows = rows_per_file * window_files
    cached = cached_input(root, "window_rows", window_rows)
    if cached is not None:
        return cached
    started = time.perf_counter()
    rng = np.random.default_rng(spec.seed)
    source, kind = plan_stream(spec, rng, window_rows)
    orig_pos = np.flatnonzero(kind == 0)
    rates = rng.lognormal(0.0, 0.5, spec.producers)
    producer = rng.choice(spec.producers, len(orig_pos), p=rates / rates.sum())
    ids, swaps = sequence_ids(spec, rng, producer, orig_pos // window_rows)
    split = check_sequence_rules(
        producer[source], ids[source], kind, orig_pos[source] // window_rows, window_rows
    )
    originals = original_rows(rng, producer, ids)
    write_parquet_files(originals.take(pa.array(source)), root / "input", rows_per_file)
    truth = {
        "spec": asdict(spec),
        "rows": spec.rows,
        "unique": len(orig_pos),
        "duplicate": spec.rows - len(orig_pos),
        "producers": len(np.unique(producer)),
        "swaps": swaps,
        **split,
        "window_rows": window_rows,
        "generated_seconds": round(time.perf_counter() - started, 1),
    }
    truth_path.write_text(json.dumps(truth, indent=1))
    return root / "input", truth


def original_rows(rng: np.random.Generator, producer: np.ndarray, ids: np.ndarray) -> pa.Table:
    names = pa.array([f"device-{i:05d}" for i in range(int(producer.max()) + 1)], pa.string())
    producers = names.take(pa.array(producer))
    seq = pa.array(ids, pa.int64())
    return pa.table(
        {
            "producer": producers,
            "seq": seq,
            "event_id": pc.binary_join_element_wise(producers, pc.cast(seq, pa.string()), "-"),
            "payload": random_text(rng, len(ids), 70, 90),
        }
    )


def run_spark(variant: str, input_dir: Path, work: Path, files_per_trigger: int) -> dict[str, Any]:
    """Stream the input through the sink with ``variant``'s options; time and CPU of the run."""
    sampler = TreeSampler().start()
    spark = local_session_builder(
        f"bench-sequence-{variant}", {"spark.driver.memory": "2g"}
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(str(next(input_dir.glob("*.parquet")))).schema
    writer = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(input_dir))
        .writeStream.format("dedup")
        .options(**SINK_OPTIONS[variant])
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
    )
    timed = time_stream(writer, sampler)
    add_batch = sum(p["durationMs"].get("addBatch", 0) for p in timed.progress) / 1000
    spark.stop()
    return {
        "seconds": timed.seconds,
        "cpu_seconds": timed.cpu_seconds,
        "batches": len(timed.progress),
        "add_batch_seconds": add_batch,
    }


def run_engine(variant: str, input_dir: Path, work: Path, files_per_trigger: int) -> dict[str, Any]:
    """The sink's tasks and commits in this process: one task per file, a commit per window."""
    from dedupsink.sink.local import LocalSink

    tables = [pq.read_table(f) for f in sorted(input_dir.glob("*.parquet"))]
    options = {"path": str(work / "out"), **SINK_OPTIONS[variant]}
    sink = LocalSink(options, tables[0].schema, query_id="bench-sequence")
    times = {"task_seconds": 0.0, "classify_seconds": 0.0, "commit_seconds": 0.0}
    started = time.perf_counter()
    cpu_before = time.process_time()
    for batch_id, first in enumerate(range(0, len(tables), files_per_trigger)):
        summaries = []
        for partition, table in enumerate(tables[first : first + files_per_trigger]):
            summary = sink.task(batch_id, partition, table.to_batches(max_chunksize=10_000))
            times["task_seconds"] += summary.seconds
            times["classify_seconds"] += summary.classify_seconds
            summaries.append(summary)
        tick = time.perf_counter()
        sink.commit(batch_id, summaries)
        times["commit_seconds"] += time.perf_counter() - tick
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "batches": len(range(0, len(tables), files_per_trigger)),
        **times,
    }


def store_measures(output: Path) -> dict[str, Any]:
    """The store's live bytes, bytes on disk, and the live bytes after each window."""
    from dedupsink.store.store import BucketStore

    store = BucketStore(str(output / "_store"))
    growth = {}
    task_seconds = 0.0
    for version in store.versions():
        manifest = store.read(version)
        if manifest is not None and version > 0:
            live = sum(wf.nbytes for wf in manifest.files.values())
            growth[version] = [live, manifest.remembered_keys, len(manifest.files)]
            if manifest.last_window is not None:
                task_seconds += manifest.last_window.task_seconds
    latest = store.read()
    assert latest is not None
    data_files, data_bytes = store.disk_usage()
    disk_files, disk_bytes = dir_bytes(output / "_store")
    return {
        "live_bytes": sum(wf.nbytes for wf in latest.files.values()),
        "live_files": len(latest.files),
        "remembered": latest.remembered_keys,
        "manifest_bytes": len(latest.to_bytes()),
        "data_files": data_files,
        "data_bytes": data_bytes,
        "disk_files": disk_files,
        "disk_bytes": disk_bytes,
        "growth": growth,
        "sink_task_seconds": task_seconds,
    }


def port_measures(output: Path) -> dict[str, Any]:
    """Rows of each port, and the distinct event ids among the unique rows."""
    record: dict[str, Any] = {}
    for port in PORTS:
        folder = output / port
        record[f"port_{port}"] = (
            ds.dataset(str(folder), format="parquet").count_rows() if folder.exists() else 0
        )
    unique = ds.dataset(str(output / "unique"), format="parquet").to_table(columns=["event_id"])
    record["unique_distinct"] = pc.count_distinct(unique["event_id"]).as_py()
    return record


def child(args: argparse.Namespace) -> None:
    work = Path(args.work)
    engine = args.variant.startswith(ENGINE)
    variant = args.variant.removeprefix(ENGINE)
    run = run_engine if engine else run_spark
    record = run(variant, Path(args.input), work, args.files_per_trigger)
    record |= store_measures(work / "out") | port_measures(work / "out")
    print(RESULT_PREFIX + json.dumps(record), flush=True)


# -- the orchestrator ------------------------------------------------------------------------


def launch(variant: str, input_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    options = ["--variant", variant, "--input", str(input_dir)]
    options += ["--files-per-trigger", str(args.files_per_trigger)]
    record = run_child(__file__, f"sequence-{variant}", options, DATA_DIR / "runs")
    record["variant"] = variant
    return record


def check(record: dict[str, Any], truth: dict[str, Any]) -> str:
    """The ports against the truth: unique = first copies (each event id once), duplicate =
    re-sends, nothing expired or in error."""
    ports = {p: record[f"port_{p}"] for p in PORTS}
    expected = {
        "unique": truth["unique"],
        "duplicate": truth["duplicate"],
        "expired": 0,
        "error": 0,
    }
    ok = ports == expected and record["unique_distinct"] == truth["unique"]
    return f"unique {ports['unique']:,} ({'ok' if ok else 'MISMATCH'}: truth {truth['unique']:,})"


def run_line(
    number: int, args: argparse.Namespace, record: dict[str, Any], truth: dict[str, Any]
) -> str:
    rate = truth["rows"] / record["seconds"]
    line = (
        f"round {number}/{args.repeats} {record['variant']:<16} {record['seconds']:6.1f} s "
        f"{rate:>10,.0f} rows/s  CPU {record['cpu_seconds']:5.1f} s  {check(record, truth)}"
    )
    if "add_batch_seconds" in record:
        line += (
            f"  addBatch {record['add_batch_seconds']:.1f} s, the sink's tasks "
            f"{record['sink_task_seconds']:.1f} s"
        )
    if "task_seconds" in record:
        line += (
            f"  tasks {record['task_seconds']:.1f} s (classify {record['classify_seconds']:.1f}),"
            f" commits {record['commit_seconds']:.1f} s"
        )
    producers = truth["producers"]
    line += (
        f"  store live {record['live_bytes']:,} B = {record['live_bytes'] / producers:.1f}"
        f" B/producer, on disk {record['disk_bytes']:,} B"
    )
    return line + f"  load {os.getloadavg()[0]:.2f}"


def report_state(results: dict[str, list[dict[str, Any]]], truth: dict[str, Any]) -> None:
    """The store after the last run of each variant (and whether every run left the same),
    then its live bytes after windows 5, 10, 15 and 20."""
    producers = truth["producers"]
    print()
    print(f"state per producer ({producers:,} producers), last run of each variant:")
    for variant, records in results.items():
        r = records[-1]
        same = all(
            (x["live_bytes"], x["disk_bytes"]) == (r["live_bytes"], r["disk_bytes"])
            for x in records
        )
        print(
            f"  {variant}: live window files {r['live_bytes']:,} B in {r['live_files']} files = "
            f"{r['live_bytes'] / producers:.1f} B/producer ({r['remembered']:,} entries); "
            f"_store on disk {r['disk_bytes']:,} B in {r['disk_files']} files = "
            f"{r['disk_bytes'] / producers:.1f} B/producer (of it data/ {r['data_bytes']:,} B "
            f"in {r['data_files']} files, the latest manifest {r['manifest_bytes']:,} B)"
            + ("" if same else "; OTHER RUNS DIFFER")
        )
    print()
    print("live window-file bytes (entries) after window N, last run of each variant:")
    for variant, records in results.items():
        growth = records[-1]["growth"]
        cells = [
            f"{w}: {growth[str(w)][0]:,} B ({growth[str(w)][1]:,})"
            for w in GROWTH_WINDOWS
            if str(w) in growth
        ]
        print(f"  {variant:<16} " + ", ".join(cells))


def report(results: dict[str, list[dict[str, Any]]], truth: dict[str, Any]) -> None:
    print()
    for variant, records in results.items():
        rates = [truth["rows"] / r["seconds"] for r in records]
        cpu = median([truth["rows"] / r["cpu_seconds"] for r in records])
        shown = " ".join(f"{x:,.0f}" for x in rates)
        print(
            f"{variant:<16} median {median(rates):>10,.0f} rows/s (runs {shown}); "
            f"{cpu:,.0f} rows per CPU-second"
        )
    report_state(results, truth)
    print()
    for ours, theirs in (
        ("engine-sequence", "engine-keys"),
        ("sequence", "keys-pair"),
        ("sequence", "keys"),
    ):
        if ours in results and theirs in results:
            rounds = list(zip(results[ours], results[theirs], strict=False))
            ratio = median([b["seconds"] / a["seconds"] for a, b in rounds])
            cpu = median([b["cpu_seconds"] / a["cpu_seconds"] for a, b in rounds])
            name = f"ratio_{ours}_vs_{theirs}".replace("-", "_")
            print(f"{name}={ratio:.3f} (per CPU-second {cpu:.3f})")


def orchestrate(args: argparse.Namespace) -> None:
    print_machine()
    start_revision = code_revision()
    spec = SequenceSpec(rows=args.rows, files=args.files, producers=args.producers)
    input_dir, truth = generate_input(spec, args.files_per_trigger)
    print(
        f"input: {truth['rows']:,} rows in {args.files} files ({input_dir}), "
        f"{truth['producers']:,} producers, {truth['unique']:,} unique (producer, seq), "
        f"{truth['duplicate']:,} re-sends ({truth['resends_same_window']:,} in their original's "
        f"window, {truth['resends_later']:,} in a later one), {truth['swaps']:,} swapped pairs; "
        f"{args.files_per_trigger} files ({truth['window_rows']:,} rows) a micro-batch"
    )
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    compile_bytecode()
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    load = LoadSampler().start()
    for number in range(1, args.repeats + 1):
        for variant in variants:
            record = launch(variant, input_dir, args)
            results[variant].append(record)
            print(run_line(number, args, record, truth), flush=True)
    load.stop()
    if code_revision() != start_revision:
        print(f"WARNING: dedupsink changed during the runs: {start_revision} -> {code_revision()}")
    print(load.summary())
    report(results, truth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--producers", type=int, default=10_000)
    parser.add_argument("--files-per-trigger", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)}",
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    run_main(parser, "variant", child, orchestrate)


if __name__ == "__main__":
    main()
