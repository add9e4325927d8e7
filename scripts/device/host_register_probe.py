"""Compare three ways to move one tensor read on CPU to the GPU (needs only torch).

Pinned staging (patch 0005) reads the tensor with parallel preads into one
reusable pinned buffer and copies it from there.  The alternative it was
chosen over registers the shard's own mapping with the GPU
(``cudaHostRegister``) and copies straight from the page cache, with no CPU
copy but with every page pinned first.  This probe times both, and the
pageable path, on one safetensors-like file in /dev/shm, to the end of the
GPU copy, and checks every result bitwise.

    python3 scripts/device/host_register_probe.py --out "$OUT"
"""

import argparse
import json
import mmap
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

MiB = 1 << 20
HOST_REGISTER_DEFAULT = 0
HOST_REGISTER_READ_ONLY = 8


def make_file(path, payload_bytes, offset):
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (payload_bytes,), dtype=torch.uint8, generator=gen)
    with open(path, "wb") as f:
        f.write(b"\0" * offset)
        f.write(data.numpy().tobytes())
    return data


def pinned_threads(path, offset, n, dst, pinned, threads, chunk):
    view = memoryview(pinned.numpy())
    fd = os.open(path, os.O_RDONLY)
    try:

        def read(start):
            end = min(start + chunk, n)
            got = os.preadv(fd, [view[start:end]], offset + start)
            assert got == end - start

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, range(0, n, chunk)))
    finally:
        os.close(fd)
    dst.copy_(pinned[:n], non_blocking=True)
    torch.cuda.synchronize()


def pageable(path, offset, n, dst):
    host = torch.empty(n, dtype=torch.uint8)
    with open(path, "rb") as f:
        f.seek(offset)
        assert f.readinto(memoryview(host.numpy())) == n
    dst.copy_(host)
    torch.cuda.synchronize()


def registered(path, offset, n, dst, flags, timings):
    cudart = torch.cuda.cudart()
    # A read-only mapping can only be registered read-only; a failed
    # registration leaves a sticky CUDA error, so the mode follows the flag.
    read_only = flags == HOST_REGISTER_READ_ONLY
    with open(path, "rb" if read_only else "r+b") as f:
        prot = mmap.PROT_READ if read_only else mmap.PROT_READ | mmap.PROT_WRITE
        mapping = mmap.mmap(f.fileno(), 0, prot=prot)
    # The mapping is unmapped when the last tensor on it is gone.
    host = torch.frombuffer(mapping, dtype=torch.uint8)
    t0 = time.perf_counter()
    err = cudart.cudaHostRegister(host.data_ptr(), host.numel(), flags)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    t1 = time.perf_counter()
    dst.copy_(host[offset : offset + n], non_blocking=True)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    cudart.cudaHostUnregister(host.data_ptr())
    t3 = time.perf_counter()
    timings.append((t1 - t0, t2 - t1, t3 - t2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    n = args.mib * MiB
    offset = 8 + 4088  # a header, so the payload is not page aligned
    path = "/dev/shm/host_register_probe.bin"
    ref = make_file(path, n, offset).cuda()
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    t0 = time.perf_counter()
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    alloc_s = time.perf_counter() - t0

    results = {"payload_bytes": n, "pinned_alloc_s": alloc_s, "methods": {}}
    methods = {
        "pinned buffer, 16 threads x 16 MiB": lambda t: pinned_threads(
            path, offset, n, dst, pinned, 16, 16 * MiB
        ),
        "pageable read + copy": lambda t: pageable(path, offset, n, dst),
        "cudaHostRegister of the mapping, read-only": lambda t: registered(
            path, offset, n, dst, HOST_REGISTER_READ_ONLY, t
        ),
        "cudaHostRegister of the mapping": lambda t: registered(
            path, offset, n, dst, HOST_REGISTER_DEFAULT, t
        ),
    }
    for name, run in methods.items():
        times, parts, error = [], [], None
        for _ in range(args.repeats):
            dst.zero_()
            try:
                t0 = time.perf_counter()
                run(parts)
                times.append(time.perf_counter() - t0)
            except Exception as e:  # a method the platform refuses is reported
                error = f"{type(e).__name__}: {e}"
                break
            if not torch.equal(dst, ref):
                error = "result differs from the file"
                break
        entry = {"error": error, "times_s": times}
        if times:
            med = statistics.median(times)
            entry.update(median_s=med, gb_per_s=n / med / 1e9)
        if parts:
            entry["median_register_copy_unregister_s"] = [
                statistics.median(p[i] for p in parts) for i in range(3)
            ]
        results["methods"][name] = entry
        print(name, json.dumps(entry), flush=True)
    os.unlink(path)
    with open(os.path.join(args.out, "host_register_probe.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
