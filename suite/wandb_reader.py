"""Read a wandb offline run file (``run-<id>.wandb``) back into history, summary, config, the run's name, group,
job type and tags, and the files it saved (plots, tables, ``metrics.json``: under ``<run folder>/files``).

wandb >= 0.31 ships no Python reader. The file is a LevelDB-log framed stream: a 7-byte header (``:W&B``, magic
0xBEE1, version), 32 KiB blocks, records with a 7-byte header (crc32 u32, length u16, type u8 with 1 = full,
2 = first, 3 = middle, 4 = last) whose payloads are ``wandb_internal_pb2.Record`` protobufs. The format is
internal to wandb; the suite's tests cross-check it against the CSV logger.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7


@dataclass
class WandbRun:
    """What an offline run file holds: ``history`` rows, the final ``summary`` and the ``config``."""

    path: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    complete: bool = False  # the run's exit record was written
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # paths saved, relative to ``files_dir``

    @property
    def files_dir(self) -> Path:
        """Where the run keeps the files it saved (``offline-run-*/files``)."""
        return self.path.parent / "files"

    def media(self, key: str) -> list[dict[str, Any]]:
        """Every value logged under ``key`` that is a file (an image, a table): wandb's description of it, with
        ``path`` relative to :attr:`files_dir`."""
        return [row[key] for row in self.history if isinstance(row.get(key), dict) and "path" in row[key]]

    def table(self, key: str) -> dict[str, Any]:
        """The last ``wandb.Table`` logged under ``key``: ``{"columns": [...], "data": [[...], ...]}``."""
        found = [m for m in self.media(key) if m.get("_type") == "table-file"]
        if not found:
            raise KeyError(f"no table logged under {key!r}")
        return json.loads((self.files_dir / found[-1]["path"]).read_text())


def _payloads(data: bytes) -> Iterator[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a wandb run file (bad magic)")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + _HEADER + length > len(data):  # a record wandb is still writing: the file ends mid-record
            return
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def _items(items: Any) -> dict[str, Any]:
    """Items as a dict: ``key`` or a one-part ``nested_key`` is a key; a longer ``nested_key`` (a logged image's
    ``path``, ``width``, ...) is a dict under its first part."""
    out: dict[str, Any] = {}
    for i in items:
        parts = [i.key] if i.key else list(i.nested_key)
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = json.loads(i.value_json)
    return out


def read_wandb_run(path: str | Path) -> WandbRun:
    """Parse ``run-<id>.wandb``. A file wandb is still writing reads up to its last whole record; a record that does
    not parse raises ``ValueError`` naming the file."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    run = WandbRun(path)
    for raw in _payloads(path.read_bytes()):
        record = pb.Record()
        try:
            record.ParseFromString(raw)
        except DecodeError as err:
            raise ValueError(f"{path}: a record does not parse as a wandb record ({err})") from err
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "run":
            info = record.run
            run.name, run.group, run.job_type = info.display_name, info.run_group, info.job_type
            run.tags = list(info.tags)
            run.config.update(_items(info.config.update))
        elif kind == "files":
            run.files += [f.path for f in record.files.files if f.path not in run.files]
        elif kind == "exit":
            run.complete = True
    return run


def wait_for_wandb_run(path: str | Path, timeout: float = 60.0) -> WandbRun:
    """wandb's service writes the offline file asynchronously, even after ``finish()`` returns: poll until the
    exit record is there (or ``timeout`` seconds pass) and return what was read."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            run = read_wandb_run(path)
        except (ValueError, OSError):
            run = WandbRun(Path(path))
        if run.complete or time.monotonic() > deadline:
            return run
        time.sleep(0.25)


def find_wandb_files(run_dir: str | Path) -> list[Path]:
    """All offline run files under a run folder."""
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
