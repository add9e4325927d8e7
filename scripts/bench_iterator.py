"""The InstantTensor iterator's per-tensor CPU cost at scale, next to its base.

Run from the project root, with the series applied (`make apply`):

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=work/vllm:scripts/cpu_site \
        .venv/bin/python scripts/bench_iterator.py [--tensors 20000 100000] [--rounds 4]

The base is the stand-in InstantTensor's own `safe_open(...).tensors()` (what
vLLM 0.34.0's `instanttensor_weights_iterator` wraps), the series is
`instanttensor_weights_iterator` over the same files; both feed one consumer
that copies each 1 KiB tensor into a preallocated destination, as a weight
loader does.  Every case runs once per round, base and series in alternating
order, all in this one process; the figures are CPU seconds of this process
(other processes on a shared machine do not count): median and minimum over
the rounds, and the microseconds the series adds per tensor at each.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tests.model_executor.model_loader.instanttensor_loader import (
    instanttensor_stand_in as stand_in_mod,
)
from vllm.model_executor.model_loader.weight_utils import (
    instanttensor_weights_iterator,
)

PER_SHARD = 1000
CASES = {"copy (options unset)": {}, "borrowed": {"copy": False}}


def bench(count: int, rounds: int, stand_in, handles: dict, tmp: Path) -> None:
    """Print one row per case for *count* tensors."""
    shards = {
        f"model-{s + 1:05d}.safetensors": {
            f"model.layers.{s}.w{i}": torch.full((512,), i % 97, dtype=torch.bfloat16)
            for i in range(PER_SHARD)
        }
        for s in range(count // PER_SHARD)
    }
    files = stand_in_mod.save_shards(tmp, shards)
    dests = {n: torch.empty(512, dtype=torch.bfloat16) for t in shards.values() for n in t}

    def consume(weights) -> float:
        t0 = time.process_time()
        n = 0
        for name, tensor in weights:
            dests[name].copy_(tensor)
            n += 1
        assert n == len(dests)
        return time.process_time() - t0

    def base(options):
        copy = options.get("copy") is not False
        with stand_in.safe_open(
            list(files), "pt", 0, copy=copy, tensor_name_match_mode="exact"
        ) as reader:
            yield from reader.tensors()

    def series(options):
        return instanttensor_weights_iterator(list(files), False, **options)

    times: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        for label, options in CASES.items():
            sides = [("base", base), ("series", series)]
            for side, make in sides if rnd % 2 == 0 else sides[::-1]:
                handles.clear()
                times.setdefault((label, side), []).append(consume(make(options)))
    for label in CASES:
        b, s = times[label, "base"], times[label, "series"]
        bm, sm = statistics.median(b), statistics.median(s)
        print(
            f"{count:,} | {label} | {bm:.3f} ({min(b):.3f}) | {sm:.3f} ({min(s):.3f}) "
            f"| {sm / bm:.3f} ({min(s) / min(b):.3f}) "
            f"| {(sm - bm) / count * 1e6:.1f} ({(min(s) - min(b)) / count * 1e6:.1f})",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    monkeypatch = pytest.MonkeyPatch()
    stand_in = stand_in_mod.install_stand_in(monkeypatch)
    handles: dict[str, object] = {}

    def read_tensor(path: str, name: str) -> torch.Tensor:
        # One handle per file, as InstantTensor streams a file.
        if path not in handles:
            handles[path] = safe_open(path, framework="pt", device="cpu")
        return handles[path].get_tensor(name)

    monkeypatch.setattr(stand_in_mod, "read_tensor", read_tensor)
    print(
        "tensors | case | base s median (min) | series s median (min) "
        "| x base median (min) | us added per tensor median (min)"
    )
    for count in args.tensors:
        with tempfile.TemporaryDirectory() as tmp:
            bench(count, args.rounds, stand_in, handles, Path(tmp))
    monkeypatch.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
