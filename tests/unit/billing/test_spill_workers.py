"""Spill files with several workers: each writes its own, and whichever starts first replays them all."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from switchyard.billing.ledger import LedgerWriter, adopt_spill_files, worker_spill_path
from switchyard.billing.store import open_database
from tests.unit.billing.test_ledger import eventually
from tests.unit.billing.test_store import usage


def _spill(path: Path, *request_ids: str) -> None:
    path.write_text("".join(json.dumps(dataclasses.asdict(usage(r))) + "\n" for r in request_ids))


def _spill_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("ledger-spill"))


def test_each_worker_has_its_own_spill_file_beside_the_configured_one(tmp_path: Path) -> None:
    base = tmp_path / "ledger-spill.jsonl"
    assert worker_spill_path(base, 0) == tmp_path / "ledger-spill.worker-0.jsonl"
    assert worker_spill_path(base, 1) != worker_spill_path(base, 0)


async def test_the_next_start_replays_every_workers_spill_file_whatever_the_number_of_workers(tmp_path: Path) -> None:
    base = tmp_path / "ledger-spill.jsonl"
    _spill(base, "single")  # a single process's
    _spill(worker_spill_path(base, 1), "w1-a", "w1-b")  # workers of an earlier run
    _spill(worker_spill_path(base, 3), "w3")
    _spill(worker_spill_path(base, 2).with_name("ledger-spill.worker-2.jsonl.replay-0123abcd"), "w2-aside")
    _spill(worker_spill_path(base, 1).with_name("ledger-spill.worker-1.jsonl.rejected"), "refused")
    (tmp_path / "unrelated.jsonl").write_text("{}\n")
    # the next start runs one process: its writer uses the configured path itself
    assert adopt_spill_files(base, base) == 3
    assert not worker_spill_path(base, 1).exists() and not worker_spill_path(base, 3).exists()
    assert (tmp_path / "ledger-spill.worker-1.jsonl.rejected").exists()  # set apart on purpose: kept
    assert (tmp_path / "unrelated.jsonl").exists() and base.exists()  # its own file stays where it is

    database = await open_database(f"sqlite:///{tmp_path / 'usage.db'}")
    try:
        writer = LedgerWriter(database, base, flush_interval_s=0.05)
        await writer.start()
        assert writer.status().spilled == 5
        await eventually(lambda: writer.status().spilled == 0)
        await writer.aclose()
        ids = sorted(r.request_id for r in await database.read_usage())
    finally:
        await database.aclose()
    assert ids == ["single", "w1-a", "w1-b", "w2-aside", "w3"]
    assert _spill_names(tmp_path) == ["ledger-spill.worker-1.jsonl.rejected"]  # every replayed file deleted


def test_workers_adopt_into_the_first_workers_file(tmp_path: Path) -> None:
    base = tmp_path / "ledger-spill.jsonl"
    _spill(base, "single")
    _spill(worker_spill_path(base, 0), "w0")  # the first worker's own: replayed by it, not renamed
    assert adopt_spill_files(base, worker_spill_path(base, 0)) == 1
    names = _spill_names(tmp_path)
    assert names[0] == "ledger-spill.worker-0.jsonl"
    assert names[1].startswith("ledger-spill.worker-0.jsonl.replay-") and len(names) == 2


def test_nothing_to_adopt_when_the_folder_does_not_exist(tmp_path: Path) -> None:
    base = tmp_path / "missing" / "ledger-spill.jsonl"
    assert adopt_spill_files(base, base) == 0
