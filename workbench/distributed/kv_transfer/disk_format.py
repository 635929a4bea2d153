"""The disk tier's file format and the folder's housekeeping (no torch: bytes and paths).

One file per offloaded block, `<root>/<namespace>/<key[:2]>/<key>.kv` (`tiers.disk_file`):

    b"WBKV2\\n"
    {"key": "<hex>", "shape": [...], "dtype": "torch.float32", "sha256": "<hex>"}\\n
    <payload: the host slot's raw bytes>

`sha256` is the digest of `key + "\\n" + payload`: it vouches for the bytes *and* for the key
the file is stored under, so a zeroed, bit-flipped or truncated payload, or another block's
payload of the right length, fails the check. A file is written to a temporary name in its
folder (`.<key>.kv.<pid>.<random>.tmp`) and renamed into place: readers never see half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
from pathlib import Path

MAGIC = b"WBKV2\n"
TMP_SUFFIX = ".tmp"
Buffer = bytes | bytearray | memoryview
STALE_TMP_S = 60.0  # a temporary file untouched this long belongs to no live write


class BadKVFile(ValueError):
    """Disk-tier files that exist but fail their check; each was removed when found."""

    def __init__(self, reasons: list[str]) -> None:
        more = f" (and {len(reasons) - 1} more bad files)" if len(reasons) > 1 else ""
        super().__init__(reasons[0] + more)
        self.reasons = reasons


def payload_digest(key_hex: str, payload: Buffer) -> str:
    h = hashlib.sha256(key_hex.encode())
    h.update(b"\n")
    h.update(payload)
    return h.hexdigest()


def encode_header(key_hex: str, shape: tuple[int, ...], dtype: str, payload: Buffer) -> bytes:
    """MAGIC + the header line; the payload follows it."""
    header = {"key": key_hex, "shape": list(shape), "dtype": dtype,
              "sha256": payload_digest(key_hex, payload)}
    return MAGIC + json.dumps(header).encode() + b"\n"


def check_file(blob: bytearray, path: Path, key_hex: str, shape: tuple[int, ...], dtype: str,
               num_bytes: int) -> memoryview:
    """The payload of a whole file read into `blob`; BadKVFile([reason]) when its magic,
    header, length or digest disagree with what the reader expects under `key_hex`."""
    view = memoryview(blob)
    if not blob.startswith(MAGIC):
        raise BadKVFile([f"{path}: not a KV block file (no {MAGIC!r} magic)"])
    nl = blob.find(b"\n", len(MAGIC))
    try:
        header = json.loads(bytes(view[len(MAGIC):nl])) if nl >= 0 else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise BadKVFile([f"{path}: unreadable header"])
    if header.get("key") != key_hex or tuple(header.get("shape", ())) != shape \
            or header.get("dtype") != dtype:
        raise BadKVFile([f"{path}: header {header} does not match key {key_hex}, shape "
                         f"{shape}, dtype {dtype}"])
    payload = view[nl + 1:]
    if len(payload) != num_bytes:
        raise BadKVFile([f"{path}: {len(payload)} payload bytes, expected {num_bytes}"])
    if header.get("sha256") != payload_digest(key_hex, payload):
        raise BadKVFile([f"{path}: payload digest mismatch (the bytes or the key are not the "
                         "ones written)"])
    return payload


def remove_if_unchanged(path: Path, seen: os.stat_result) -> None:
    """Delete the bad file that was read, not one another instance renamed over it since."""
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino, now.st_mtime_ns) == (seen.st_dev, seen.st_ino,
                                                         seen.st_mtime_ns):
            os.unlink(path)


def temp_path(path: Path) -> Path:
    """A name no other writer uses (instances sharing the folder, threads of one process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(TMP_SUFFIX)


def tier_files(folder: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of every regular file under `folder`: block files, temporary
    files, anything else; what the tier occupies on disk."""
    out = []
    for f in folder.rglob("*"):
        try:
            st = f.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((st.st_mtime, st.st_size, f))
    return out


def remove_stale_temps(folder: Path, now: float, max_age_s: float = STALE_TMP_S) -> int:
    """Delete the temporary files under `folder` not modified for `max_age_s` (left by a
    write that died with its process); a younger one may be another instance's write in
    flight. Returns the number deleted."""
    removed = 0
    for mtime, _, f in tier_files(folder):
        if is_temp(f) and now - mtime >= max_age_s:
            with contextlib.suppress(OSError):
                f.unlink()
                removed += 1
    return removed
