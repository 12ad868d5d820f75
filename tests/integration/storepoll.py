"""tests/integration/storepoll.py - watching the store while a save runs.

StorePoller lists a prefix of a harness store (S3Store or DirStore) every few
milliseconds in a thread and keeps, per key, each new version it saw and the number of
the listing that first showed it. Tests of the commit order ask it which listing first
showed a key, or its final version, and which sizes a key was seen at. Keys first seen
in the same listing count as simultaneous. Upload temporaries (`.ckptfs-upload.*`) are
left out.
"""

import os
import threading
import time


def versions(store, prefix):
    """{key: (size, signature)} of every object below prefix, from one listing (the
    signature changes when a new version is stored: ETag on S3, mtime and inode in a dir)."""
    out = {}
    if store.kind == "dir":
        for d, _, files in os.walk(os.path.join(store.root, prefix)):
            for f in files:
                p = os.path.join(d, f)
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue
                out[os.path.relpath(p, store.root)] = (st.st_size, (st.st_mtime_ns, st.st_ino))
        return out
    strip = len(store.prefix) + 1 if store.prefix else 0
    pages = store.s3.get_paginator("list_objects_v2").paginate(Bucket=store.bucket,
                                                               Prefix=store.key(prefix))
    for page in pages:
        for o in page.get("Contents", []):
            out[o["Key"][strip:]] = (o["Size"], o["ETag"])
    return out


class StorePoller:
    """Use as a context manager around the save; the last listing is taken at exit, so
    what landed after the previous one (a sync waited for it) is seen too."""

    def __init__(self, store, prefix, interval=0.02):
        self.store, self.prefix, self.interval = store, prefix, interval
        self.hist = {}  # key -> [(listing, size, sig)], one entry per version seen
        self.listings = 0
        self.errors = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True, name="store-poller")

    def poll(self):
        self.listings += 1
        for k, (size, sig) in versions(self.store, self.prefix).items():
            if ".ckptfs-upload." in k:
                continue
            h = self.hist.setdefault(k, [])
            if not h or h[-1][1:] != (size, sig):
                h.append((self.listings, size, sig))

    def loop(self):
        while not self.stop.is_set():
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - a listing failed: kept, reported
                self.errors.append(repr(e))
            time.sleep(self.interval)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(30)
        self.poll()

    def seen(self):
        """Every key any listing showed."""
        return set(self.hist)

    def first_seen(self, key):
        """The first listing that showed key, or None."""
        return self.hist[key][0][0] if key in self.hist else None

    def final_from(self, key):
        """The first listing that showed key's last version seen, or None."""
        return self.hist[key][-1][0] if key in self.hist else None

    def sizes_seen(self, key):
        """The sizes key was listed at, one per version seen."""
        return [s for _, s, _ in self.hist.get(key, [])]

    def listed_after(self, commit, needed, final=False):
        """The keys of needed that no listing up to the first one showing commit showed
        (with final: compares the listings that first showed each one's final version)."""
        when = self.final_from if final else self.first_seen
        t_commit = when(commit)
        assert t_commit is not None, f"{commit} never reached the store: {sorted(self.hist)}"
        return sorted(k for k in needed if when(k) is None or when(k) > t_commit)
