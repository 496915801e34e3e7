#!/usr/bin/env python3
"""Does a preallocated segment make fdatasync cheaper on this disk? (issue 21, lever 3)

Median fdatasync after a 256 B write, 400 writes, in three kinds of file on the disk of the
current directory: appending past the end (what the stream log does: each sync also commits
the new size), writing inside a posix_fallocate'd range (unwritten extents: the sync commits
their conversion instead), and writing inside a range already written with zeros and synced
(no metadata left to commit). Usage: python3 bench/fsync_prealloc.py [rounds]
"""
import os, statistics, sys, time

def run(mode, n=400):
    path = f"fsync-prealloc-{os.getpid()}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, 4 << 20)
            os.fsync(fd)
        elif mode == "zeros":
            os.write(fd, b"\0" * (4 << 20))
            os.fsync(fd)
        record, offset, samples = b"x" * 256, 0, []
        for _ in range(n):
            os.pwrite(fd, record, offset)
            offset += 256
            started = time.perf_counter()
            os.fdatasync(fd)
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1e6
    finally:
        os.close(fd)
        os.unlink(path)

for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    print("  ".join(f"{mode} {run(mode):.0f} µs" for mode in ["append", "fallocate", "zeros"]))
