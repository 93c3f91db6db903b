"""An on-disk store of artifacts, shared safely by any number of processes.

    store = DiskStore()                      # default_directory(), bounded by max_bytes
    store.put(key, {"program.so": blob}, {"abi": 3})   # -> True, or False if it could not
    entry = store.get(key)                   # -> Entry (verified) or None
    entry.meta, entry.read("program.so"), entry.path("program.so")
    store.clear(); store.stats()

    python -m camlir.disk_store info|clear [--dir D]

This module knows nothing of torch or MLIR and imports only the standard library: what goes
in an entry, and the key, are the caller's business. See docs/disk-cache.md.

Layout under the root directory:

    lock                         flock(2)ed by eviction and clear()
    entries/<key>/manifest.json  format version, key, creation time, size and sha256 of
                                 every file, the caller's meta
    entries/<key>/<name>         the files
    tmp/put-<key>-<random>/      an entry being written (renamed to entries/<key> when done)
    tmp/del-<key>-<random>/      an entry moved aside to be deleted

Guarantees:
- `put` is atomic: an entry is written completely into tmp/, then renamed into entries/.
  A writer killed before the rename leaves only a temp dir, which no reader looks at and
  which eviction deletes once it is `STALE_TEMP_SECONDS` old. When two processes write
  the same key, the first complete entry wins and the other is discarded.
- `get` verifies everything (format version, key, the exact set of files, each size and
  sha256) and returns None for anything else, after logging a warning and removing the
  entry. Removing is a rename out of entries/ followed by a delete, so it is safe while
  another process reads the same entry. `get` never raises for a bad or vanished entry.
- IO problems (read-only directory, disk full, permissions) never raise: `put` returns
  False and logs why, on the `camlir` logger. Bad arguments (a key that is not lowercase
  hex, a file name with a slash, meta that is not JSON) raise ValueError or TypeError.
- After each `put`, least-recently-used entries are removed until the total size is at
  most `max_bytes` (never the entry just written). "Used" means written or returned by
  `get`: both set the manifest's mtime.
"""

import argparse
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Tuple

try:
    import fcntl
except ImportError:  # not POSIX: eviction runs unlocked (every step is a rename anyway)
    fcntl = None

from camlir import environment  # standard library only, like this module

log = logging.getLogger("camlir")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB
ENV_DIR = "CAMLIR_CACHE_DIR"
ENV_MAX_BYTES = "CAMLIR_CACHE_MAX_BYTES"
STALE_TEMP_SECONDS = 3600

_KEY_RE = re.compile(r"[0-9a-f]{16,128}")
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_SIZE_RE = re.compile(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def default_directory() -> str:
    """`$CAMLIR_CACHE_DIR` if set (and not empty), else `$XDG_CACHE_HOME/camlir` if
    `XDG_CACHE_HOME` is an absolute path (the XDG spec says to ignore a relative one),
    else `~/.cache/camlir`."""
    explicit = environment.text(ENV_DIR)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = environment.raw("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "camlir")
    return os.path.join(os.path.expanduser("~"), ".cache", "camlir")


def parse_size(text: str) -> int:
    """`"1048576"`, `"512M"`, `"2GiB"`, `"64k"` -> bytes (binary units). ValueError otherwise."""
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (expected e.g. 1073741824, 512M or 2G)")
    return int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower() or " "))


def default_max_bytes() -> int:
    """`$CAMLIR_CACHE_MAX_BYTES` if set and valid (a bad value is logged and ignored), else
    `DEFAULT_MAX_BYTES`."""
    text = environment.text(ENV_MAX_BYTES)
    if text:
        try:
            return parse_size(text)
        except ValueError as exc:
            log.warning("ignoring %s=%r: %s", ENV_MAX_BYTES, text, exc)
    return DEFAULT_MAX_BYTES


def check_key(key) -> str:
    """A key is lowercase hex, 16 to 128 digits (e.g. a sha256 hexdigest): it names a
    directory, so nothing else may pass. Raises ValueError."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"invalid disk store key {key!r}: expected 16 to 128 lowercase hex digits")
    return key


def _check_name(name) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name == MANIFEST:
        raise ValueError(f"invalid file name {name!r} in a disk store entry: expected letters, "
                         f"digits, '_', '-', '.', not starting with '.' or '-', not {MANIFEST!r}")
    return name


class _Bad(Exception):
    """An entry failed verification; the message says why."""


class _Vanished(Exception):
    """The entry disappeared (or was replaced) while it was being read."""


class Entry:
    """A verified entry, as returned by `DiskStore.get`.

    `key`, `meta` (the dict given to `put`), `created` (time.time() at `put`), `sizes`
    ({name: bytes}), `directory`. `read(name)` returns the file's bytes as they were
    verified by `get` (held in memory, so they stay valid whatever other processes do);
    `path(name)` is the file's path in the store, for consumers that need a path (e.g. to
    dlopen a library): it stays valid until another process evicts or clears the entry,
    and a get made it the most recently used one, so eviction takes it last.
    """

    def __init__(self, key, directory, meta, created, data: Dict[str, bytes]):
        self.key = key
        self.directory = directory
        self.meta = meta
        self.created = created
        self._data = data
        self.sizes = {name: len(blob) for name, blob in data.items()}

    def names(self) -> List[str]:
        return sorted(self._data)

    def read(self, name: str) -> bytes:
        """The verified bytes of file `name`; KeyError if the entry has no such file."""
        return self._data[name]

    def path(self, name: str) -> str:
        """The path of file `name` in the store; KeyError if the entry has no such file."""
        if name not in self._data:
            raise KeyError(name)
        return os.path.join(self.directory, name)

    def __repr__(self):
        return f"Entry({self.key[:16]}..., files={self.names()}, meta={self.meta!r})"


class Stats:
    """What `DiskStore.stats()` returns: `directory`, `entries`, `total_bytes`, `max_bytes`."""

    def __init__(self, directory, entries, total_bytes, max_bytes):
        self.directory, self.entries = directory, entries
        self.total_bytes, self.max_bytes = total_bytes, max_bytes

    def __repr__(self):
        return (f"Stats(directory={self.directory!r}, entries={self.entries}, "
                f"total_bytes={self.total_bytes}, max_bytes={self.max_bytes})")


class DiskStore:
    """A directory of entries, each a set of named files plus a manifest, bounded in total
    size with least-recently-used eviction. See the module docstring for the guarantees.

    `directory`: default `default_directory()`; it is created on the first `put`.
    `max_bytes`: default `$CAMLIR_CACHE_MAX_BYTES` or 1 GiB; counts every file of every
    entry, manifests included. An entry larger than `max_bytes` by itself is not stored.
    `fsync`: flush each entry to disk before publishing it (on by default: a power loss
    must not publish a half-written entry; tests may turn it off for speed).
    """

    stale_temp_seconds = STALE_TEMP_SECONDS

    def __init__(self, directory: Optional[str] = None, max_bytes: Optional[int] = None,
                 fsync: bool = True):
        self.directory = os.path.abspath(directory if directory is not None else default_directory())
        if max_bytes is None:
            max_bytes = default_max_bytes()
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._entries = os.path.join(self.directory, "entries")
        self._tmp = os.path.join(self.directory, "tmp")
        self._lock_path = os.path.join(self.directory, "lock")

    def __repr__(self):
        return f"DiskStore({self.directory!r}, max_bytes={self.max_bytes})"

    # ---------------------------------------------------------------- writing

    def put(self, key: str, files: Dict[str, bytes], meta: dict) -> bool:
        """Stores `files` ({name: bytes}) and `meta` (a JSON-serializable dict) under `key`.

        Returns True once an entry for `key` is in the store: this one, or one that another
        process completed first (then this one is discarded). Returns False, after logging
        why, if it could not store (IO error, or the entry alone exceeds `max_bytes`).
        Raises ValueError/TypeError only for bad arguments."""
        check_key(key)
        if not isinstance(files, dict):
            raise TypeError(f"files must be a dict of name -> bytes, got {type(files).__name__}")
        if not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        blobs = {}
        for name, blob in files.items():
            _check_name(name)
            if not isinstance(blob, (bytes, bytearray, memoryview)):
                raise TypeError(f"file {name!r}: expected bytes, got {type(blob).__name__}")
            blobs[name] = bytes(blob)
        manifest = {
            "format": FORMAT_VERSION,
            "key": key,
            "created": time.time(),
            "files": {name: {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
                      for name, blob in sorted(blobs.items())},
            "meta": meta,
        }
        try:
            manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(f"meta must be JSON-serializable: {exc}") from None
        size = len(manifest_bytes) + sum(len(b) for b in blobs.values())
        if size > self.max_bytes:
            log.warning("disk store %s: not storing entry %s: %d bytes exceed max_bytes=%d",
                        self.directory, key, size, self.max_bytes)
            return False

        tmpdir = None
        try:
            os.makedirs(self._entries, exist_ok=True)
            os.makedirs(self._tmp, exist_ok=True)
            tmpdir = tempfile.mkdtemp(prefix=f"put-{key}-", dir=self._tmp)
            for name, blob in blobs.items():
                self._write(os.path.join(tmpdir, name), blob)
            # The manifest last: a temp dir with a manifest is complete.
            self._write(os.path.join(tmpdir, MANIFEST), manifest_bytes)
            self._sync_dir(tmpdir)
            published = self._publish(key, tmpdir)
        except OSError as exc:
            log.warning("disk store %s: could not store entry %s: %s", self.directory, key, exc)
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
            return False
        if not published:
            return True  # another writer's complete entry won; ours was discarded
        try:
            self._evict(keep=key)
        except OSError as exc:  # the entry is stored; only the bound is late
            log.warning("disk store %s: eviction failed: %s", self.directory, exc)
        return True

    def _write(self, path, blob):
        with open(path, "xb") as f:
            f.write(blob)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())

    def _sync_dir(self, path):
        if not self.fsync:
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass  # some file systems cannot fsync a directory
        finally:
            os.close(fd)

    def _publish(self, key, tmpdir) -> bool:
        """Renames `tmpdir` to entries/<key>. True if ours is now the entry; False if a
        valid entry was already there (ours is deleted). A bad entry in the way is removed
        and the rename retried. OSError for anything else."""
        dest = os.path.join(self._entries, key)
        for _ in range(3):
            try:
                os.rename(tmpdir, dest)  # atomic; fails if dest is a non-empty directory
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
            else:
                self._sync_dir(self._entries)
                return True
            try:
                st = os.stat(dest)
            except FileNotFoundError:
                continue  # removed meanwhile: retry
            try:
                self._verify(key, dest, st)
            except _Vanished:
                continue
            except _Bad as bad:
                log.warning("disk store: removing bad entry %s (in the way of a put): %s", dest, bad)
                self._discard(key, dest, st)
                continue
            log.debug("disk store: entry %s was completed by another writer; discarding ours", dest)
            shutil.rmtree(tmpdir, ignore_errors=True)
            return False
        raise OSError(f"entries/{key} keeps changing under concurrent writers")

    # ---------------------------------------------------------------- reading

    def get(self, key: str) -> Optional[Entry]:
        """The verified entry for `key`, or None: missing, or bad (logged as a warning and
        removed), or vanished while read (another process evicted it: logged at info).
        Marks the entry as the most recently used. Raises only ValueError, for a bad key."""
        check_key(key)
        path = os.path.join(self._entries, key)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("disk store: cannot read entry %s: %s", path, exc)
            return None
        try:
            entry = self._verify(key, path, st)
        except _Vanished:
            log.info("disk store: entry %s disappeared while it was read (evicted or "
                     "replaced by another process)", path)
            return None
        except _Bad as bad:
            log.warning("disk store: removing bad entry %s: %s", path, bad)
            self._discard(key, path, st)
            return None
        try:
            os.utime(os.path.join(path, MANIFEST))  # last use, for LRU
        except OSError as exc:
            log.debug("disk store: cannot mark %s as used: %s", path, exc)
        return entry

    def _same(self, path, st) -> bool:
        try:
            now = os.stat(path)
        except OSError:
            return False
        # Inode numbers are reused at once (a deleted entry's number often goes to the next
        # mkdtemp): the ctime, which a rename or a new directory sets, tells them apart.
        return (now.st_ino, now.st_dev, now.st_ctime_ns) == (st.st_ino, st.st_dev, st.st_ctime_ns)

    def _verify(self, key, path, st) -> Entry:
        """The Entry at `path` (whose stat was `st`) if it is intact. _Bad(reason) if not;
        _Vanished if reading failed because the directory was moved or replaced meanwhile."""
        try:
            return self._verify_unchecked(key, path)
        except (_Bad, OSError) as exc:
            if not self._same(path, st):
                raise _Vanished() from None
            if isinstance(exc, _Bad):
                raise
            raise _Bad(f"{type(exc).__name__}: {exc}") from None

    def _verify_unchecked(self, key, path) -> Entry:
        if not os.path.isdir(path):
            raise _Bad("not a directory")
        try:
            with open(os.path.join(path, MANIFEST), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise _Bad(f"no {MANIFEST}") from None
        try:
            manifest = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Bad(f"{MANIFEST} is not valid JSON ({exc})") from None
        if not isinstance(manifest, dict):
            raise _Bad(f"{MANIFEST} is not a JSON object")
        version = manifest.get("format")
        if version != FORMAT_VERSION:
            raise _Bad(f"format version {version!r}, expected {FORMAT_VERSION}")
        if manifest.get("key") != key:
            raise _Bad(f"manifest is for key {manifest.get('key')!r}, not this one")
        files, meta, created = manifest.get("files"), manifest.get("meta"), manifest.get("created")
        if not isinstance(files, dict) or not isinstance(meta, dict) \
                or not isinstance(created, (int, float)):
            raise _Bad(f"{MANIFEST} lacks a valid files, meta or created field")
        present = set(os.listdir(path)) - {MANIFEST}
        if present != set(files):
            missing, extra = sorted(set(files) - present), sorted(present - set(files))
            raise _Bad(f"files missing: {missing}, unexpected files: {extra}")
        data = {}
        for name, info in files.items():
            try:
                _check_name(name)
            except ValueError as exc:
                raise _Bad(str(exc)) from None
            if not isinstance(info, dict) or not isinstance(info.get("size"), int) \
                    or not isinstance(info.get("sha256"), str):
                raise _Bad(f"{MANIFEST} has no valid size and sha256 for file {name!r}")
            with open(os.path.join(path, name), "rb") as f:
                blob = f.read(info["size"] + 1)
            if len(blob) != info["size"]:
                raise _Bad(f"file {name!r} has {len(blob)}{'+' if len(blob) > info['size'] else ''} "
                           f"bytes, manifest says {info['size']}")
            if hashlib.sha256(blob).hexdigest() != info["sha256"]:
                raise _Bad(f"file {name!r}: sha256 mismatch (content corrupted)")
            data[name] = blob
        return Entry(key, path, meta, created, data)

    # ---------------------------------------------------------------- removing

    def _discard(self, key, path, st=None) -> bool:
        """Moves entries/<key> aside into tmp/ (atomic: a reader with the files open keeps
        reading them; one that opens them later finds nothing), then deletes it. With `st`,
        only if `path` is still that directory (not a fresh entry written meanwhile).
        True if this call removed it."""
        if st is not None and not self._same(path, st):
            return False
        try:
            os.makedirs(self._tmp, exist_ok=True)
            aside = os.path.join(self._tmp, f"del-{key}-{secrets.token_hex(4)}")
            os.rename(path, aside)
        except FileNotFoundError:
            return False  # someone else removed it
        except OSError as exc:
            log.warning("disk store: cannot remove entry %s: %s", path, exc)
            return False
        _remove_tree(aside)
        return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds an exclusive flock on <root>/lock (eviction and clear() run one at a time
        across processes; readers and writers never wait for it)."""
        fd = None
        if fcntl is not None:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                log.debug("disk store: running unlocked: cannot lock %s: %s", self._lock_path, exc)
                if fd is not None:
                    os.close(fd)
                    fd = None
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the flock

    def _scan(self) -> List[Tuple[float, int, str]]:
        """(last use, total bytes, key) of every entry directory, as found on disk."""
        out = []
        try:
            names = os.listdir(self._entries)
        except FileNotFoundError:
            return out
        except OSError as exc:
            log.warning("disk store: cannot list %s: %s", self._entries, exc)
            return out
        for key in names:
            if not _KEY_RE.fullmatch(key):
                continue
            path = os.path.join(self._entries, key)
            try:
                try:
                    last_use = os.stat(os.path.join(path, MANIFEST)).st_mtime
                except FileNotFoundError:
                    last_use = 0.0  # no manifest: broken, evict first
                size = sum(e.stat(follow_symlinks=False).st_size
                           for e in os.scandir(path) if e.is_file(follow_symlinks=False))
            except FileNotFoundError:
                continue  # removed meanwhile
            except NotADirectoryError:
                try:
                    last_use, size = 0.0, os.stat(path).st_size
                except OSError:
                    continue
            except OSError as exc:
                log.debug("disk store: cannot scan %s: %s", path, exc)
                continue
            out.append((last_use, size, key))
        return out

    def _clean_tmp(self, now=None) -> int:
        """Deletes what killed processes left in tmp/: entries moved aside for deletion, and
        unfinished writes older than `stale_temp_seconds`. Returns how many."""
        now = time.time() if now is None else now
        removed = 0
        try:
            names = os.listdir(self._tmp)
        except OSError:
            return 0
        for name in names:
            path = os.path.join(self._tmp, name)
            try:
                age = now - os.stat(path).st_mtime
            except OSError:
                continue
            if name.startswith("del-") or age > self.stale_temp_seconds:
                _remove_tree(path)
                removed += 1
        return removed

    def _evict(self, keep: Optional[str] = None) -> None:
        with self._locked():
            cleaned = self._clean_tmp()
            if cleaned:
                log.info("disk store %s: removed %d leftover temp dir(s)", self.directory, cleaned)
            entries = self._scan()
            total = sum(size for _, size, _ in entries)
            evicted = 0
            for _, size, key in sorted(entries):
                if total <= self.max_bytes:
                    break
                if key == keep:
                    continue
                path = os.path.join(self._entries, key)
                if self._discard(key, path):
                    evicted += 1
                if not os.path.lexists(path):  # gone (by us or by whoever beat us to it)
                    total -= size
            if evicted:
                log.info("disk store %s: evicted %d least recently used entr%s (now %d bytes, "
                         "max %d)", self.directory, evicted, "y" if evicted == 1 else "ies",
                         total, self.max_bytes)

    def clear(self) -> int:
        """Removes every entry (and leftover temp dirs; a write still in progress in another
        process is left alone and may publish after this returns). Returns how many entries
        were removed. IO errors are logged, not raised."""
        removed = 0
        if not os.path.isdir(self.directory):
            return 0
        try:
            with self._locked():
                for _, _, key in self._scan():
                    if self._discard(key, os.path.join(self._entries, key)):
                        removed += 1
                self._clean_tmp()
        except OSError as exc:
            log.warning("disk store %s: clear failed: %s", self.directory, exc)
        return removed

    def stats(self) -> Stats:
        """The number of entries and their total size on disk (manifests included), as
        found now (no verification, no lock)."""
        entries = self._scan()
        return Stats(self.directory, len(entries), sum(size for _, size, _ in entries), self.max_bytes)


def _remove_tree(path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def main(argv=None) -> int:
    """`python -m camlir.disk_store info|clear [--dir D]`; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m camlir.disk_store",
                                     description="Inspect or empty camlir's on-disk cache.")
    parser.add_argument("command", choices=("info", "clear"),
                        help="info: where the cache is and what it holds; clear: remove every entry")
    parser.add_argument("--dir", default=None,
                        help=f"the cache directory (default: ${ENV_DIR}, else "
                             f"$XDG_CACHE_HOME/camlir, else ~/.cache/camlir)")
    args = parser.parse_args(argv)
    store = DiskStore(args.dir)
    if args.command == "clear":
        n = store.clear()
        print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {store.directory}")
    else:
        s = store.stats()
        print(f"directory: {s.directory}")
        print(f"entries:   {s.entries}")
        print(f"size:      {_human(s.total_bytes)} ({s.total_bytes} bytes)")
        print(f"max size:  {_human(s.max_bytes)} ({s.max_bytes} bytes; ${ENV_MAX_BYTES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
