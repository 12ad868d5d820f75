"""Reads of a checkpoint's data files that bypass the kernel's page cache (FOPEN_DIRECT_IO,
see core_file_direct_reads in fs/core/files.c): no kernel readahead past what a partial
load wants. By default (--direct-reads sharded) every such file but those whose bytes are
mostly whole tensors or bytes items (every rank loads those) of 16 kernel readahead windows
or more, which keep the page cache (the unit test test_direct_reads.c has such a file; the
fixture's whole items are a few KiB: read direct); --direct-reads all / none for every file
/ none. Over s3rver, a torch
1.13 checkpoint (the shared fixture: one item per file; __0_0 a chunk of a sharded tensor,
__0_3 a whole tensor, __0_8 a bytes item): a direct file read with read(), pread() and a
private map (torch.load(mmap=True) maps MAP_PRIVATE) gives the stored bytes; a shared map
of one is refused (libfuse 3.14 cannot map a direct-I/O handle shared), which is how the
test sees that the kernel got the flag; .metadata and a .distcp outside a checkpoint
directory still map shared (page cache as before).
"""

import errno
import mmap
import os

import pytest

import harness

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.environ.get("CKPTFS_FIXTURES", os.path.join(os.path.dirname(REPO), "shared", "fixtures"))
CK = os.path.join(FIX, "dcp-torch1.13", "per_item")


def mapped(path, flags):
    """The bytes of path through mmap(flags), or the errno of a refused map."""
    with open(path, "rb") as f:
        try:
            m = mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
        except OSError as e:
            return e.errno
        try:
            return bytes(m)
        finally:
            m.close()


def test_checkpoint_data_files_read_direct(s3server, mounter, request):
    if not os.path.isdir(CK):
        pytest.skip(f"no fixture at {CK}")
    store = harness.S3Store(s3server, harness.unique_prefix(request.node.name))
    names = sorted(os.listdir(CK))
    want = {n: open(os.path.join(CK, n), "rb").read() for n in names}
    store.put_many([(f"ck/{n}", os.path.join(CK, n)) for n in names] +
                   [("plain/__0_0.distcp", want["__0_0.distcp"])])
    none = mounter(store, "--direct-reads=none")
    with open(none.p("ck/.metadata"), "rb") as f:
        f.read()
    assert mapped(none.p("ck/__0_0.distcp"), mmap.MAP_SHARED) == want["__0_0.distcp"]
    none.close()
    every = mounter(store, "--direct-reads=all")
    with open(every.p("ck/.metadata"), "rb") as f:
        f.read()
    for n in ("__0_0.distcp", "__0_3.distcp", "__0_8.distcp"):
        assert mapped(every.p("ck/" + n), mmap.MAP_SHARED) == errno.ENODEV, n
    every.close()
    mnt = mounter(store)  # the default: sharded
    with open(mnt.p("ck/.metadata"), "rb") as f:  # a load reads .metadata first
        assert f.read() == want[".metadata"]
    for n in ("__0_3.distcp", "__0_8.distcp"):  # every rank reads these, but they are small
        assert mapped(mnt.p("ck/" + n), mmap.MAP_SHARED) == errno.ENODEV, n
    data = want["__0_0.distcp"]
    path = mnt.p("ck/__0_0.distcp")
    assert harness.read_file(path, chunk=128 << 10) == data
    fd = os.open(path, os.O_RDONLY)
    try:
        for off, n in ((0, 4096), (1000, 70000), (len(data) - 5000, 9000), (len(data), 10)):
            assert os.pread(fd, n, off) == data[off:off + n], (off, n)
    finally:
        os.close(fd)
    assert mapped(path, mmap.MAP_PRIVATE) == data
    assert mapped(path, mmap.MAP_SHARED) == errno.ENODEV, "the handle is not direct"
    assert mapped(mnt.p("ck/.metadata"), mmap.MAP_SHARED) == want[".metadata"]
    assert mapped(mnt.p("plain/__0_0.distcp"), mmap.MAP_SHARED) == data
