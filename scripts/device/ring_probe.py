"""Where a bounded load loses its time: InstantTensor's stream through a small ring.

With a 64 MiB bound the qualification's bounded load takes about 1.5x the
unbounded one, although the one tensor read on CPU costs little.  This probe
times InstantTensor alone (one GPU, no vLLM) on the qualification's
synthetic checkpoint (7.9 GiB; 56 MiB MLP matrices, a 62.5 MiB embedding) in
/dev/shm, the way the series calls it with one rank, and varies one thing at
a time: the ring size, the `tensor_filter` the series passes, and
InstantTensor's chunk size.
Every configuration is timed in interleaved rounds (median), to the end of
the stream; once, before timing, each one's tensors are compared bitwise with
`safetensors`' reads of the same files.

    python3 scripts/device/ring_probe.py --out "$OUT"

It installs instanttensor from the bundle's wheels (copy `.device/` beside `scripts/device`).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import torch

HERE = Path(__file__).resolve().parent
MiB = 1 << 20


def as_bytes(tensor):
    return tensor.reshape(-1).view(torch.uint8)


def install_instanttensor(site: Path) -> None:
    wheels = sorted(str(p) for p in (HERE.parents[1] / ".device" / "wheels").glob("*.whl"))
    subprocess.run(common.install_wheels_command(sys.executable, wheels, site), check=True)
    sys.path.insert(0, str(site))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ring-probe-", dir="/dev/shm"))
    install_instanttensor(work / "site")

    import instanttensor
    from safetensors import safe_open

    sys.path.insert(0, str(HERE))
    import make_checkpoints

    t0 = time.monotonic()
    info = make_checkpoints.make_synthetic(work)
    folder = work / "synthetic"
    files = sorted(str(p) for p in folder.glob("*.safetensors"))
    payload = info["payload_bytes"]
    print(
        f"checkpoint: {payload / 2**30:.2f} GiB in {len(files)} shards, largest "
        f"tensor {info['largest_tensor_bytes'] / MiB:.1f} MiB ({time.monotonic() - t0:.0f} s)",
        flush=True,
    )
    configs = {
        "unbounded": {},
        "64 MiB ring": {"buffer_size": 64 * MiB},
        "64 MiB ring + tensor_filter (the series, one rank)": {
            "buffer_size": 64 * MiB,
            "filter": True,
        },
        "64 MiB ring + tensor_filter, 1 MiB chunks": {
            "buffer_size": 64 * MiB,
            "filter": True,
            "chunk_size": MiB,
        },
        "64 MiB ring + tensor_filter, 512 KiB chunks": {
            "buffer_size": 64 * MiB,
            "filter": True,
            "chunk_size": MiB // 2,
        },
        "128 MiB ring": {"buffer_size": 128 * MiB},
        "256 MiB ring": {"buffer_size": 256 * MiB},
        "128 MiB ring + tensor_filter": {"buffer_size": 128 * MiB, "filter": True},
        "192 MiB ring + tensor_filter": {"buffer_size": 192 * MiB, "filter": True},
        "256 MiB ring + tensor_filter": {"buffer_size": 256 * MiB, "filter": True},
    }
    # The reference: every tensor read with safetensors, on the GPU.
    reference: dict = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118
                reference[name] = f.get_tensor(name).to("cuda:0")
    all_names = list(reference)

    def load(cfg: dict, check: bool) -> tuple[float, list[str]]:
        kw = {k: v for k, v in cfg.items() if k in ("buffer_size", "chunk_size")}
        if cfg.get("filter"):
            kw |= {"tensor_filter": all_names, "tensor_name_match_mode": "exact"}
        torch.cuda.synchronize()
        start = time.perf_counter()
        seen, wrong = set(), []
        with instanttensor.safe_open(
            files, framework="pt", device=0, process_group=None, copy=True, **kw
        ) as f:
            for name, tensor in f.tensors():
                seen.add(name)
                # Bytes, not values: random payloads hold NaN patterns.
                if check and not torch.equal(as_bytes(reference[name]), as_bytes(tensor)):
                    wrong.append(name)
        torch.cuda.synchronize()
        if check:
            wrong += sorted(set(all_names) - seen)
        return time.perf_counter() - start, wrong

    times: dict[str, list[float]] = {k: [] for k in configs}
    wrong_by_config = {}
    for label, cfg in configs.items():  # warm-up and bitwise check
        _, wrong = load(cfg, check=True)
        wrong_by_config[label] = wrong
        sizes = sorted({reference[n].numel() * reference[n].element_size() for n in wrong})
        print(
            f"{label}: {len(wrong)} of {len(all_names)} tensors differ from safetensors"
            + (
                f" (e.g. {wrong[:3]}, sizes {[round(b / MiB, 2) for b in sizes[:6]]} MiB)"
                if wrong
                else ""
            ),
            flush=True,
        )
    for _ in range(args.rounds):
        for label, cfg in configs.items():
            times[label].append(load(cfg, check=False)[0])
    base = statistics.median(times["unbounded"])
    result = {
        "payload_bytes": payload,
        "largest_tensor_bytes": info["largest_tensor_bytes"],
        "rounds": args.rounds,
        "configs": {},
    }
    for label, ts in times.items():
        med = statistics.median(ts)
        result["configs"][label] = {
            "median_s": med,
            "times_s": ts,
            "gib_s": payload / med / 2**30,
            "x_unbounded": med / base,
        }
        print(
            f"{label:<52} {med:.3f} s  {payload / med / 2**30:6.2f} GiB/s  "
            f"x unbounded {med / base:.2f}",
            flush=True,
        )
    result["torch"] = torch.__version__
    result["instanttensor"] = getattr(instanttensor, "__version__", "?")
    (args.out / "ring_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
