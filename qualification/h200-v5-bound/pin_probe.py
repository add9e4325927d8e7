"""What pinning host memory for one load costs on the GPU machine.

Each way of getting N bytes of pinned host memory, timed from nothing to a
host-to-device copy of all of it: cudaHostRegister of fresh NumPy memory
(one call, or 64 MiB pieces from 1 and 16 threads), the same after the pages
were written (as a read fills them), torch's pin_memory=True (first time in
the process, then again: its cache), and pageable memory as the reference.
Run: python3 pin_probe.py > pin_probe.txt
"""

import concurrent.futures
import time

import numpy as np
import torch

PIECE = 64 << 20
cudart = torch.cuda.cudart()


def register(arena, threads=0):
    ptr, n = arena.ctypes.data, arena.nbytes
    if not threads:
        assert int(cudart.cudaHostRegister(ptr, n, 0)) == 0
        return [(ptr, n)]
    pieces = [(ptr + i, min(PIECE, n - i)) for i in range(0, n, PIECE)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        errors = list(pool.map(lambda p: int(cudart.cudaHostRegister(p[0], p[1], 0)), pieces))
    assert not any(errors), errors
    return pieces


def h2d(host, dev):
    dev.copy_(torch.from_numpy(host) if isinstance(host, np.ndarray) else host)
    torch.cuda.synchronize()


def main():
    torch.cuda.init()
    for gib in (1, 3):
        n = gib << 30
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        rows = {}
        for label, threads, touch in (
            ("register, fresh", 0, False),
            ("register, written first", 0, True),
            ("register 64 MiB pieces, 1 thread", 1, False),
            ("register 64 MiB pieces, 16 threads", 16, False),
            ("register 64 MiB pieces, 16 threads, written first", 16, True),
        ):
            t0 = time.perf_counter()
            arena = np.empty(n, dtype=np.uint8)
            if touch:
                arena.fill(1)
            t1 = time.perf_counter()
            pieces = register(arena, threads)
            t2 = time.perf_counter()
            host = torch.frombuffer(arena, dtype=torch.uint8)
            try:
                h2d(host, dev)
            except Exception as e:  # noqa: BLE001
                print(f"{label}: copy failed, is_pinned={host.is_pinned()}: {e}".splitlines()[0])
            t3 = time.perf_counter()
            del host
            for ptr, _ in pieces:
                cudart.cudaHostUnregister(ptr)
            t4 = time.perf_counter()
            rows[label] = (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        for again in ("first", "cached"):
            t0 = time.perf_counter()
            pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            t1 = time.perf_counter()
            h2d(pinned, dev)
            t2 = time.perf_counter()
            del pinned
            rows[f"torch pin_memory=True, {again}"] = (0.0, t1 - t0, t2 - t1, 0.0)
        t0 = time.perf_counter()
        arena = np.ones(n, dtype=np.uint8)
        t1 = time.perf_counter()
        h2d(arena, dev)
        rows["pageable"] = (t1 - t0, 0.0, time.perf_counter() - t1, 0.0)
        print(f"## {gib} GiB: seconds (allocate/write, pin, H2D copy, unpin)")
        for label, r in rows.items():
            print(f"{label:52s} " + " ".join(f"{x:7.3f}" for x in r)
                  + f"   pin {n / r[1] / 1e9 if r[1] else float('nan'):6.1f} GB/s")
        del dev


if __name__ == "__main__":
    main()
