"""What a first load pays to read one 1 GiB tensor on CPU into fresh host
memory, and pin it, on the GPU machine.

Each way of getting the memory runs in a fresh Python process (a server
loads once): NumPy's ``np.empty`` (the pinned reader's arena), an anonymous
``mmap`` with ``MADV_HUGEPAGE`` or ``MADV_NOHUGEPAGE``, and NumPy memory
written once before (the second load of a process that kept its memory).
Each row: reading the tensor from /dev/shm by 16 threads in 64 MiB chunks
(as the pinned reader does), ``cudaHostRegister`` of it, the host-to-device
copy, and the huge pages the memory got. ``mmap.mmap(-1, n)`` maps shared
anonymous memory, which the host's transparent huge pages for private
memory do not cover: its rows got none whatever the advice, so they show
4 KiB pages against NumPy's huge ones, not the effect of ``MADV_HUGEPAGE``.
Run: python3 host_memory_probe.py > host_memory_probe.txt
"""

import concurrent.futures
import mmap
import os
import subprocess
import sys
import time

GIB = 1 << 30
CHUNK = 64 << 20
SOURCE = "/dev/shm/host_memory_probe.bin"
WAYS = ("numpy", "mmap hugepage", "mmap nohugepage", "numpy, written before")


def anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages"))


def read_into(view: memoryview) -> None:
    def pread(i: int) -> None:
        fd = os.open(SOURCE, os.O_RDONLY)
        try:
            part, offset = view[i : i + CHUNK], i
            while part:
                n = os.preadv(fd, [part], offset)
                part, offset = part[n:], offset + n
        finally:
            os.close(fd)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(pread, range(0, len(view), CHUNK)))


def one(way: str) -> None:
    import numpy as np
    import torch

    torch.cuda.init()
    device = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    huge_before = anon_huge_kib()
    t0 = time.perf_counter()
    if way.startswith("numpy"):
        arena = np.empty(GIB, dtype=np.uint8)
        if way.endswith("before"):
            arena.fill(0)
            t0 = time.perf_counter()
    else:
        m = mmap.mmap(-1, GIB)
        m.madvise(mmap.MADV_HUGEPAGE if way.endswith(" hugepage") else mmap.MADV_NOHUGEPAGE)
        arena = np.frombuffer(m, dtype=np.uint8)
    read_into(memoryview(arena))
    t1 = time.perf_counter()
    cudart = torch.cuda.cudart()
    assert int(cudart.cudaHostRegister(arena.ctypes.data, GIB, 0)) == 0
    t2 = time.perf_counter()
    device.copy_(torch.from_numpy(arena))
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    cudart.cudaHostUnregister(arena.ctypes.data)
    huge = (anon_huge_kib() - huge_before) >> 10
    total = t3 - t0
    print(f"{way:<24} read {t1 - t0:.3f}  pin {t2 - t1:.3f}  h2d {t3 - t2:.3f}  "
          f"total {total:.3f} s  ({GIB / total / 1e9:.1f} GB/s)  huge pages {huge} MiB",
          flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        one(sys.argv[1])
        return
    for name in ("enabled", "defrag"):
        path = f"/sys/kernel/mm/transparent_hugepage/{name}"
        print(f"transparent_hugepage/{name}: {open(path).read().strip()}")
    with open(SOURCE, "wb") as f:
        f.write(os.urandom(GIB))
    for round_ in range(3):
        print(f"## round {round_ + 1}: 1 GiB, fresh process per row")
        for way in WAYS:
            subprocess.run([sys.executable, __file__, way], check=True)
    os.unlink(SOURCE)


if __name__ == "__main__":
    main()
