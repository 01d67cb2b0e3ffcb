"""Measured op costs kept on disk, so a second process measures nothing measured before.

One JSON file per device and torch version (never pickle), in the cost folder:
``REMAT_COST_CACHE`` names it (``0``/``off`` turns the table off); unset, it is
``costs/`` inside the plan cache's folder, and off when the plan cache is off.
An entry is keyed by the op's signature (op, shapes, strides, dtypes, non-tensor
arguments: :func:`remat.passes.costs.profile.cache_key`) and holds what the profiler
measured: seconds, FLOPs, workspace bytes. A file that does not parse, fails its
checksum or was made for another device or torch is ignored with a warning and
replaced. Loading costs from another process is what makes two processes (two
runs of a script, two ranks on one machine) plan alike: measured times differ
between processes, the table's do not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from .plan_cache import OFF

log = logging.getLogger(__name__)

FORMAT = 4  # bump when what a measurement means changes (grid, threads, workspace rule, measuring thread);
# 3: a symbolic size is keyed by its example value, not its name; 4: values described by
# passes/capture/values.py (the device by its type, the same description as the plan cache's)
Entry = tuple[float, float, int, bool]  # seconds, flops, workspace, measured


def cost_dir(plan_folder: Path | None) -> Path | None:
    """The cost folder: ``REMAT_COST_CACHE`` if set, else ``costs/`` in the plan cache's folder."""
    env = os.environ.get("REMAT_COST_CACHE")
    if env is not None:
        return None if env.strip().lower() in OFF else Path(env)
    return None if plan_folder is None else plan_folder / "costs"


def device_key(device: torch.device) -> dict[str, Any]:
    """What a measurement depends on besides the op: the device model, its thread count
    (CPU workspace depends on it) and torch."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu:{platform.machine()}:{platform.processor() or 'unknown'}:{torch.get_num_threads()} threads"
    return {"format": FORMAT, "device": name, "torch": torch.__version__}


def signature(key: tuple) -> str:
    """An op's cache key as the JSON string the table is keyed by."""
    return json.dumps(list(key))


class CostTable:
    """The costs measured on one device, loaded from and written back to one file."""

    def __init__(self, folder: Path, device: torch.device) -> None:
        self.key = device_key(device)
        self.path = folder / f"{_digest(self.key)[:24]}.json"
        self.entries: dict[str, Entry] = {}

    def load(self) -> dict[str, Entry]:
        """The stored entries ({} when there is no usable file)."""
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            body = {k: v for k, v in data.items() if k != "checksum"}
            if data.get("checksum") != _digest(body):
                raise ValueError("checksum mismatch (a damaged or edited file)")
            if data["key"] != self.key:
                raise ValueError("made for another device or torch version")
            self.entries = {sig: _entry(v) for sig, v in data["entries"].items()}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("remat: ignoring the op cost table %s: %s", self.path, exc)
            self.entries = {}
        return dict(self.entries)

    def store(self, new: dict[str, Entry]) -> bool:
        """Add ``new`` to the file (merged with what another process wrote meanwhile)."""
        fresh = {sig: e for sig, e in new.items() if e[3] and sig not in self.entries}
        if not fresh:
            return True
        self.load()
        self.entries.update(fresh)
        body = {"key": self.key, "entries": {sig: list(e) for sig, e in sorted(self.entries.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, suffix=".tmp", delete=False) as tmp:
                json.dump({**body, "checksum": _digest(body)}, tmp)
            os.replace(tmp.name, self.path)  # atomic: readers never see half a file
        except OSError as exc:
            log.warning("remat: could not write the op cost table in %s: %s", self.path.parent, exc)
            return False
        return True


def _entry(value: Any) -> Entry:
    seconds, flops, workspace, measured = value
    if not (isinstance(seconds, float) and seconds >= 0 and isinstance(workspace, int) and workspace >= 0):
        raise ValueError(f"an entry that is not a measurement: {value!r}")
    return float(seconds), float(flops), int(workspace), bool(measured)


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
