"""Tests of camlir.disk_store: the on-disk artifact store (standard library only, no torch)."""

import hashlib
import json
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import time

import pytest

from camlir import disk_store
from camlir.disk_store import FORMAT_VERSION, MANIFEST, DiskStore, default_directory


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


K1, K2, K3, K4 = (key_of(f"k{i}") for i in range(1, 5))
FILES = {"program.so": b"\x7fELF" + bytes(range(256)) * 4, "abi.json": b'{"inputs": 3}'}
META = {"abi": 3, "torch": "2.13.0", "names": ["a", "b"]}


@pytest.fixture
def store(tmp_path):
    return DiskStore(str(tmp_path / "cache"), max_bytes=1 << 20, fsync=False)


def entry_dir(store, key):
    return os.path.join(store.directory, "entries", key)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "camlir" and r.levelno >= logging.WARNING]


# ------------------------------------------------------------------ basics

def test_round_trip(store):
    assert store.get(K1) is None
    assert store.put(K1, FILES, META) is True
    entry = store.get(K1)
    assert entry is not None
    assert entry.key == K1
    assert entry.meta == META
    assert entry.names() == sorted(FILES)
    for name, blob in FILES.items():
        assert entry.read(name) == blob
        with open(entry.path(name), "rb") as f:
            assert f.read() == blob
    assert entry.sizes == {n: len(b) for n, b in FILES.items()}
    with pytest.raises(KeyError):
        entry.read("nope")
    with pytest.raises(KeyError):
        entry.path("nope")
    # The manifest holds what docs/disk-cache.md says it holds.
    with open(os.path.join(entry_dir(store, K1), MANIFEST)) as f:
        manifest = json.load(f)
    assert manifest["format"] == FORMAT_VERSION and manifest["key"] == K1
    assert manifest["meta"] == META and abs(manifest["created"] - time.time()) < 60
    assert manifest["files"]["abi.json"] == {
        "size": len(FILES["abi.json"]), "sha256": hashlib.sha256(FILES["abi.json"]).hexdigest()}
    # A second store object on the same directory (another process, in effect) sees it.
    assert DiskStore(store.directory).get(K1).read("program.so") == FILES["program.so"]
    # Nothing left in tmp/.
    assert os.listdir(os.path.join(store.directory, "tmp")) == []


def test_empty_entry_and_fsync_path(tmp_path):
    s = DiskStore(str(tmp_path), max_bytes=1 << 20)  # fsync on: the default path
    assert s.put(K1, {}, {}) is True
    entry = s.get(K1)
    assert entry is not None and entry.names() == [] and entry.meta == {}


def test_put_same_key_twice_keeps_first(store):
    assert store.put(K1, FILES, {"n": 1})
    assert store.put(K1, {"x": b"other"}, {"n": 2}) is True  # first complete entry wins
    entry = store.get(K1)
    assert entry.meta == {"n": 1} and entry.names() == sorted(FILES)
    assert os.listdir(os.path.join(store.directory, "tmp")) == []


@pytest.mark.parametrize("bad", [
    "", "abc", "A" * 64, "g" * 64, "0" * 15, "0" * 129, "../" + "0" * 64, "0" * 64 + "/x",
    "0" * 32 + "\n", b"0" * 64, None, 123,
])
def test_invalid_key_rejected(store, bad):
    with pytest.raises(ValueError):
        store.put(bad, FILES, META)
    with pytest.raises(ValueError):
        store.get(bad)
    assert not os.path.exists(store.directory)  # nothing was written


def test_valid_key_bounds(store):
    for key in ("0" * 16, "f" * 128, key_of("x")):
        assert store.put(key, {"a": b"1"}, {})
        assert store.get(key) is not None


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "..", MANIFEST, "-x", "a\0b"])
def test_invalid_file_name_rejected(store, name):
    with pytest.raises(ValueError):
        store.put(K1, {name: b"x"}, {})


def test_bad_arguments_are_type_errors(store):
    with pytest.raises(TypeError):
        store.put(K1, {"a": "not bytes"}, {})
    with pytest.raises(TypeError):
        store.put(K1, {"a": b"x"}, {"f": object()})
    with pytest.raises(TypeError):
        store.put(K1, [("a", b"x")], {})
    with pytest.raises(TypeError):
        store.put(K1, {"a": b"x"}, None)


# ------------------------------------------------------------------ atomicity

def test_killed_writer_leaves_no_visible_entry(store, caplog):
    assert store.put(K2, {"a": b"x"}, {})
    # A writer killed after writing its temp dir completely, before the rename.
    tmp = os.path.join(store.directory, "tmp")
    fresh = os.path.join(tmp, f"put-{K1}-fresh")
    stale = os.path.join(tmp, f"put-{K3}-stale")
    for d, key in ((fresh, K1), (stale, K3)):
        os.makedirs(d)
        with open(os.path.join(d, "a"), "wb") as f:
            f.write(b"x")
        manifest = {"format": FORMAT_VERSION, "key": key, "created": time.time(), "meta": {},
                    "files": {"a": {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}}}
        with open(os.path.join(d, MANIFEST), "w") as f:
            json.dump(manifest, f)
    # Also a writer killed halfway (no manifest) and an entry moved aside but not deleted.
    os.makedirs(os.path.join(tmp, f"put-{K4}-half"))
    os.makedirs(os.path.join(tmp, f"del-{K4}-1234"))
    old = time.time() - 2 * disk_store.STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    os.utime(os.path.join(tmp, f"put-{K4}-half"), (old, old))

    assert store.get(K1) is None and store.get(K3) is None
    assert store.stats().entries == 1
    # Cleanup happens during eviction (after a put): stale and moved-aside dirs go, the
    # fresh one (maybe a live writer) stays.
    with caplog.at_level(logging.INFO, logger="camlir"):
        assert store.put(K4, {"b": b"y"}, {})
    assert sorted(os.listdir(tmp)) == [f"put-{K1}-fresh"]
    assert store.get(K1) is None and store.get(K4) is not None
    assert warnings_of(caplog) == []


def test_put_fails_cleanly_on_read_only_directory(tmp_path, caplog):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    root = tmp_path / "ro"
    root.mkdir()
    os.chmod(root, 0o555)
    try:
        s = DiskStore(str(root / "cache"))
        with caplog.at_level(logging.WARNING, logger="camlir"):
            assert s.put(K1, FILES, META) is False
        assert any("could not store" in m for m in warnings_of(caplog))
        assert s.get(K1) is None
        assert s.clear() == 0 and s.stats().entries == 0
    finally:
        os.chmod(root, 0o755)


def test_put_fails_cleanly_when_directory_cannot_be_created(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    s = DiskStore(str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert s.put(K1, FILES, META) is False
    assert any("could not store" in m and K1 in m for m in warnings_of(caplog))
    assert s.get(K1) is None and s.clear() == 0 and s.stats().entries == 0


def test_put_fails_cleanly_on_io_error(store, caplog, monkeypatch):
    """Disk full, simulated: the write raises ENOSPC; put returns False, leaves nothing."""
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write", full)
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert store.put(K1, FILES, META) is False
    assert any("No space left" in m and K1 in m for m in warnings_of(caplog))
    monkeypatch.undo()
    assert store.get(K1) is None
    assert os.listdir(os.path.join(store.directory, "tmp")) == []
    assert store.put(K1, FILES, META) and store.get(K1) is not None


def test_entry_larger_than_bound_is_not_stored(tmp_path, caplog):
    s = DiskStore(str(tmp_path), max_bytes=1000, fsync=False)
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert s.put(K1, {"big": b"x" * 2000}, {}) is False
    assert any("exceed max_bytes" in m for m in warnings_of(caplog))
    assert s.get(K1) is None


# ------------------------------------------------------------------ corruption

def _assert_dropped(store, key, caplog, what):
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert store.get(key) is None
    msgs = warnings_of(caplog)
    assert len(msgs) == 1, msgs
    assert entry_dir(store, key) in msgs[0] and what in msgs[0], msgs[0]
    assert not os.path.exists(entry_dir(store, key))
    assert os.listdir(os.path.join(store.directory, "tmp")) == []  # moved aside, then deleted
    caplog.clear()
    # Gone for good: a second get is a quiet miss, and a fresh put works.
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert store.get(key) is None
    assert warnings_of(caplog) == []
    assert store.put(key, FILES, META)
    entry = store.get(key)
    assert entry is not None and entry.read("program.so") == FILES["program.so"]


def test_corrupt_byte(store, caplog):
    store.put(K1, FILES, META)
    path = os.path.join(entry_dir(store, K1), "program.so")
    with open(path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x01]))
    _assert_dropped(store, K1, caplog, "sha256 mismatch")


def test_truncated_file(store, caplog):
    store.put(K1, FILES, META)
    os.truncate(os.path.join(entry_dir(store, K1), "program.so"), 10)
    _assert_dropped(store, K1, caplog, "has 10 bytes")


def test_appended_file(store, caplog):
    store.put(K1, FILES, META)
    with open(os.path.join(entry_dir(store, K1), "abi.json"), "ab") as f:
        f.write(b"!")
    _assert_dropped(store, K1, caplog, "bytes, manifest says")


def test_missing_file(store, caplog):
    store.put(K1, FILES, META)
    os.unlink(os.path.join(entry_dir(store, K1), "abi.json"))
    _assert_dropped(store, K1, caplog, "files missing: ['abi.json']")


def test_unexpected_file(store, caplog):
    store.put(K1, FILES, META)
    with open(os.path.join(entry_dir(store, K1), "intruder"), "wb") as f:
        f.write(b"x")
    _assert_dropped(store, K1, caplog, "unexpected files: ['intruder']")


@pytest.mark.parametrize("garbage,what", [
    (b"", "not valid JSON"),
    (b"{\"format\": 1, \"key\": ", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
])
def test_manifest_garbage(store, caplog, garbage, what):
    store.put(K1, FILES, META)
    with open(os.path.join(entry_dir(store, K1), MANIFEST), "wb") as f:
        f.write(garbage)
    _assert_dropped(store, K1, caplog, what)


def test_manifest_missing(store, caplog):
    store.put(K1, FILES, META)
    os.unlink(os.path.join(entry_dir(store, K1), MANIFEST))
    _assert_dropped(store, K1, caplog, f"no {MANIFEST}")


def _edit_manifest(store, key, edit):
    path = os.path.join(entry_dir(store, key), MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(path, "w") as f:
        json.dump(manifest, f)


def test_manifest_fields_invalid(store, caplog):
    store.put(K1, FILES, META)
    _edit_manifest(store, K1, lambda m: m.__setitem__("files", {"abi.json": {"size": "12"},
                                                               "program.so": {}}))
    _assert_dropped(store, K1, caplog, "no valid size and sha256")
    caplog.clear()
    store.put(K2, FILES, META)
    _edit_manifest(store, K2, lambda m: m.pop("meta"))
    _assert_dropped(store, K2, caplog, "lacks a valid files, meta or created")


def test_manifest_file_name_escaping(store, caplog):
    """A manifest naming a file outside the entry is refused, never opened."""
    store.put(K1, {"a": b"x"}, {})
    _edit_manifest(store, K1, lambda m: m.__setitem__(
        "files", {"../../../etc/passwd": {"size": 1, "sha256": "0" * 64}}))
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert store.get(K1) is None
    assert not os.path.exists(entry_dir(store, K1))


def test_foreign_key(store, caplog):
    """An entry directory renamed to another key: the manifest's key gives it away."""
    store.put(K1, FILES, META)
    os.rename(entry_dir(store, K1), entry_dir(store, K2))
    _assert_dropped(store, K2, caplog, f"manifest is for key '{K1}'")


def test_version_mismatch(store, caplog):
    store.put(K1, FILES, META)
    _edit_manifest(store, K1, lambda m: m.__setitem__("format", FORMAT_VERSION + 1))
    _assert_dropped(store, K1, caplog, f"format version {FORMAT_VERSION + 1}, expected {FORMAT_VERSION}")


def test_entry_is_a_file(store, caplog):
    os.makedirs(os.path.join(store.directory, "entries"))
    with open(entry_dir(store, K1), "wb") as f:
        f.write(b"junk")
    _assert_dropped(store, K1, caplog, "not a directory")


def test_bad_entry_in_the_way_of_put_is_replaced(store, caplog):
    store.put(K1, {"a": b"old"}, {"v": 1})
    os.truncate(os.path.join(entry_dir(store, K1), "a"), 1)
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert store.put(K1, {"a": b"new"}, {"v": 2})
    assert any("in the way of a put" in m for m in warnings_of(caplog))
    entry = store.get(K1)
    assert entry.meta == {"v": 2} and entry.read("a") == b"new"


def test_entry_removed_after_get_keeps_verified_bytes(store):
    store.put(K1, FILES, META)
    entry = store.get(K1)
    assert store.clear() == 1
    assert entry.read("program.so") == FILES["program.so"]  # held in memory
    assert not os.path.exists(entry.path("program.so"))


def test_vanished_while_reading_is_a_quiet_miss(store, caplog, monkeypatch):
    """Another process evicts the entry between get's stat and its reads: None, logged at
    info, and nothing else is removed."""
    store.put(K1, FILES, META)
    real = store._verify_unchecked

    def evict_then_read(key, path):
        DiskStore(store.directory, fsync=False).clear()
        return real(key, path)

    monkeypatch.setattr(store, "_verify_unchecked", evict_then_read)
    with caplog.at_level(logging.INFO, logger="camlir"):
        assert store.get(K1) is None
    assert warnings_of(caplog) == []
    assert any("disappeared while it was read" in r.getMessage() for r in caplog.records)


def test_bad_entry_replaced_while_reading_is_not_removed(store, caplog, monkeypatch):
    """A reader that found a bad entry must not delete the good one another process put in
    its place meanwhile."""
    store.put(K1, FILES, META)
    os.truncate(os.path.join(entry_dir(store, K1), "program.so"), 5)
    real = store._verify_unchecked

    def read_then_replace(key, path):
        try:
            return real(key, path)
        finally:
            other = DiskStore(store.directory, fsync=False)
            other._discard(key, path)
            assert other.put(key, FILES, {"fresh": True})

    monkeypatch.setattr(store, "_verify_unchecked", read_then_replace)
    with caplog.at_level(logging.INFO, logger="camlir"):
        assert store.get(K1) is None
    monkeypatch.undo()
    entry = store.get(K1)
    assert entry is not None and entry.meta == {"fresh": True}


# ------------------------------------------------------------------ LRU, clear, stats

def _set_last_use(store, key, t):
    os.utime(os.path.join(entry_dir(store, key), MANIFEST), (t, t))


def test_lru_eviction_order(tmp_path):
    blob = b"z" * 1000
    probe = DiskStore(str(tmp_path / "probe"), fsync=False)
    probe.put(K1, {"f": blob}, {})
    one = probe.stats().total_bytes  # one entry's size, manifest included
    s = DiskStore(str(tmp_path / "c"), max_bytes=3 * one + one // 2, fsync=False)
    keys = [key_of(f"lru{i}") for i in range(4)]
    for key in keys[:3]:
        assert s.put(key, {"f": blob}, {})
    now = time.time()
    # Use order, oldest first: keys[1], keys[0], keys[2].
    _set_last_use(s, keys[1], now - 300)
    _set_last_use(s, keys[0], now - 200)
    _set_last_use(s, keys[2], now - 100)
    assert s.stats().entries == 3
    assert s.put(keys[3], {"f": blob}, {})  # 4 entries > bound: the least recently used goes
    assert s.get(keys[1]) is None
    assert all(s.get(k) is not None for k in (keys[0], keys[2], keys[3]))
    st = s.stats()
    assert st.entries == 3 and st.total_bytes <= s.max_bytes

    # get() marks an entry used: make keys[0] oldest on disk, then get it; now keys[2] goes.
    _set_last_use(s, keys[0], now - 1000)
    _set_last_use(s, keys[2], now - 900)
    _set_last_use(s, keys[3], now - 800)
    assert s.get(keys[0]) is not None
    assert s.put(keys[1], {"f": blob}, {})
    assert s.get(keys[2]) is None
    assert all(s.get(k) is not None for k in (keys[0], keys[1], keys[3]))


def test_eviction_never_removes_the_new_entry(tmp_path):
    s = DiskStore(str(tmp_path), max_bytes=5000, fsync=False)
    assert s.put(K1, {"f": b"a" * 1500}, {})
    assert s.put(K2, {"f": b"b" * 1500}, {})
    _set_last_use(s, K1, time.time() + 1000)  # K1 is the most recently used...
    os.utime(os.path.join(entry_dir(s, K2), MANIFEST), (1, 1))
    assert s.put(K3, {"f": b"c" * 4000}, {})  # ...K3 is in the past (written now) but kept
    assert s.get(K3) is not None
    assert s.get(K1) is None and s.get(K2) is None
    assert s.stats().total_bytes <= s.max_bytes


def test_clear_and_stats(store):
    assert store.clear() == 0  # the directory does not exist yet
    st = store.stats()
    assert (st.entries, st.total_bytes, st.directory) == (0, 0, store.directory)
    for key in (K1, K2, K3):
        store.put(key, FILES, META)
    st = store.stats()
    on_disk = sum(os.path.getsize(os.path.join(dp, f))
                  for dp, _, fs in os.walk(os.path.join(store.directory, "entries")) for f in fs)
    assert st.entries == 3 and st.total_bytes == on_disk > 3 * sum(map(len, FILES.values()))
    assert store.clear() == 3
    assert store.stats().entries == 0 and store.get(K1) is None
    assert os.listdir(os.path.join(store.directory, "entries")) == []
    assert store.put(K1, FILES, META) and store.get(K1) is not None


# ------------------------------------------------------------------ configuration

def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("CAMLIR_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == str(tmp_path / "explicit")
    assert DiskStore().directory == str(tmp_path / "explicit")
    monkeypatch.delenv("CAMLIR_CACHE_DIR")
    assert default_directory() == str(tmp_path / "xdg" / "camlir")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, per the XDG spec
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_directory() == str(tmp_path / "home" / ".cache" / "camlir")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_directory() == str(tmp_path / "home" / ".cache" / "camlir")


def test_max_bytes_from_environment(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("CAMLIR_CACHE_MAX_BYTES", raising=False)
    assert DiskStore(str(tmp_path)).max_bytes == 1 << 30
    monkeypatch.setenv("CAMLIR_CACHE_MAX_BYTES", "512M")
    assert DiskStore(str(tmp_path)).max_bytes == 512 << 20
    monkeypatch.setenv("CAMLIR_CACHE_MAX_BYTES", "12345")
    assert DiskStore(str(tmp_path)).max_bytes == 12345
    assert DiskStore(str(tmp_path), max_bytes=7).max_bytes == 7  # the argument wins
    monkeypatch.setenv("CAMLIR_CACHE_MAX_BYTES", "lots")
    with caplog.at_level(logging.WARNING, logger="camlir"):
        assert DiskStore(str(tmp_path)).max_bytes == 1 << 30
    assert any("CAMLIR_CACHE_MAX_BYTES" in m for m in warnings_of(caplog))
    with pytest.raises(ValueError):
        DiskStore(str(tmp_path), max_bytes=-1)
    assert [disk_store.parse_size(t) for t in ("2G", "2GiB", "64k", "1 MB", "0")] == \
        [2 << 30, 2 << 30, 64 << 10, 1 << 20, 0]


def test_standard_library_only():
    """The module must not pull in torch or MLIR (checked in a fresh interpreter)."""
    code = ("import sys, camlir.disk_store; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_mlir', 'numpy', 'mlir')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------ several processes

SHARED = [key_of(f"shared{i}") for i in range(3)]


def _content(key):
    """What every writer stores under `key` (deterministic, so readers can check it)."""
    blob = hashlib.sha256(key.encode()).digest() * 64  # 2 KiB
    return {"blob": blob, "small": key.encode()}, {"key": key}


def _worker(directory, wid, start_at, iterations):
    """Puts and gets shared and private keys with a bound small enough that eviction runs
    all the time; corrupts an entry now and then. Returns (hits, misses, problems)."""
    logging.getLogger("camlir").setLevel(logging.ERROR)  # warnings are expected here
    store = DiskStore(directory, max_bytes=6 * 2600, fsync=False)
    rng = random.Random(wid)
    own = [key_of(f"own{wid}-{i}") for i in range(3)]
    hits = misses = 0
    problems = []
    while time.time() < start_at:
        time.sleep(0.005)
    for it in range(iterations):
        key = rng.choice(SHARED + own)
        files, meta = _content(key)
        try:
            action = rng.random()
            if action < 0.45:
                if not store.put(key, files, meta):
                    problems.append(f"put {key[:8]} returned False")
            elif action < 0.95:
                entry = store.get(key)
                if entry is None:
                    misses += 1
                elif entry.meta != meta or any(entry.read(n) != b for n, b in files.items()):
                    problems.append(f"get {key[:8]} returned wrong content")
                else:
                    hits += 1
            else:  # sabotage: truncate a file of an entry, if there is one
                path = os.path.join(directory, "entries", key, "blob")
                try:
                    os.truncate(path, 100)
                except OSError:
                    pass
        except Exception as exc:  # noqa: BLE001 -- any exception is a failure of the store
            problems.append(f"{type(exc).__name__}: {exc}")
    return hits, misses, problems


def test_concurrent_processes(tmp_path):
    directory = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("spawn")
    nproc, iterations = 4, 150
    start_at = time.time() + 1.5  # after every worker has started
    with ctx.Pool(nproc) as pool:
        results = pool.starmap(_worker, [(directory, w, start_at, iterations) for w in range(nproc)])
    problems = [p for _, _, ps in results for p in ps]
    assert problems == []
    hits = sum(h for h, _, _ in results)
    assert hits > 0  # the test really exercised reads of shared entries

    # Consistent at the end: every entry verifies (sabotaged ones are dropped, quietly or
    # not), nothing is left in tmp/ (every writer renamed or deleted its temp dir, every
    # removal finished), and the bound holds.
    store = DiskStore(directory, max_bytes=6 * 2600, fsync=False)
    assert os.listdir(os.path.join(directory, "tmp")) == []
    for key in os.listdir(os.path.join(directory, "entries")):
        entry = store.get(key)
        if entry is not None:
            files, meta = _content(key)
            assert entry.meta == meta and entry.read("blob") == files["blob"]
    assert store.stats().total_bytes <= store.max_bytes
    for key in SHARED:  # and the store still works
        files, meta = _content(key)
        assert store.put(key, files, meta) and store.get(key) is not None


# ------------------------------------------------------------------ the command

def _cli(*args, env_dir=None):
    env = dict(os.environ)
    env.pop("CAMLIR_CACHE_DIR", None)
    if env_dir:
        env["CAMLIR_CACHE_DIR"] = env_dir
    return subprocess.run([sys.executable, "-m", "camlir.disk_store", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_command(store):
    for key in (K1, K2):
        store.put(key, FILES, META)
    r = _cli("info", "--dir", store.directory)
    assert r.returncode == 0, r.stderr
    assert f"directory: {store.directory}" in r.stdout and "entries:   2" in r.stdout
    assert f"({store.stats().total_bytes} bytes)" in r.stdout
    r = _cli("clear", env_dir=store.directory)  # the directory from $CAMLIR_CACHE_DIR
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"removed 2 entries from {store.directory}"
    assert store.get(K1) is None and store.stats().entries == 0
    r = _cli("info", "--dir", store.directory)
    assert "entries:   0" in r.stdout
    r = _cli("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr
