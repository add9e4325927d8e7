"""Tensor-parallel loading on two GPUs: the series' InstantTensor iterator with
vLLM's real world group (NCCL device group, gloo CPU group), one process a GPU.

    python3 scripts/device/tp2.py [--bundle .device] [--work /tmp/qual] [--out $OUT]

Run on a machine with two GPUs after ``run_all.sh`` or on
its own: it reuses the base and series trees and the wheels' site that
``run_all.py`` leaves under ``--work``, and unpacks or installs them itself
from the bundle when they are missing.  Writes ``tp2.json`` (every figure)
and ``tp2.log`` (this script and both ranks) to ``--out``.

Two checkpoints are written to tmpfs: *typical* (tensors above the 256 MiB
bound only in the first and last shards, under 10 % of the bytes) and *heavy*
(half the bytes above the bound, in every shard).  On each, in interleaved
rounds, every rank loads with: the base release's iterator (the base tree's, options
unset: InstantTensor's collective call), InstantTensor per rank, and the
series' iterator unset, borrowed (COPY=0), bounded, and bounded with pinned
staging.  A load is timed on each rank to the end of the consumer's copies
into preallocated GPU tensors; the figure is the slower rank's.  One verified
round per configuration compares every tensor, on every rank, bitwise with
the file.  Last, the ranks are given different buffer sizes: both must fail
with the same error, quickly.  NVLink multicast stays off.

Nothing can hang past ``--budget``: the ranks decide together (rank 0's
clock, broadcast over the CPU group) whether to start another round, they
write what they measured before each step that could fail, and the parent
stops both when one fails or the budget is spent.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402

NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
BOUND = 256 * common.MiB
SMALL_BOUND = 256 * 1024
COMMAND = "python3 scripts/device/tp2.py"
BASE_LABEL = "base, options unset (collective)"
CONFIGS = (
    BASE_LABEL,
    "InstantTensor per rank",
    "series, options unset",
    "series COPY=0",
    "series bound",
    "series bound, pinned staging",
)
TARGET = 1.25  # bounded load on the typical checkpoint, x base collective
AGREEMENT_SECONDS = 30  # both ranks must have failed by then
GRACE_SECONDS = 20  # a rank still running this long after the other failed is stopped
SHM_GIB = 16  # tmpfs for the two checkpoints (13.6 GiB)


# --- checkpoints (parent, CPU only) -------------------------------------------------


def layer(i: int, small: bool) -> list[tuple]:
    hidden, inter, kv = (256, 512, 64) if small else (4096, 14336, 1024)
    p = f"model.layers.{i}"
    return [
        (f"{p}.input_layernorm.weight", (hidden,), "BF16"),
        (f"{p}.self_attn.q_proj.weight", (hidden, hidden), "BF16"),
        (f"{p}.self_attn.k_proj.weight", (kv, hidden), "BF16"),
        (f"{p}.self_attn.v_proj.weight", (kv, hidden), "BF16"),
        (f"{p}.self_attn.o_proj.weight", (hidden, hidden), "BF16"),
        (f"{p}.mlp.gate_proj.weight", (inter, hidden), "BF16"),
        (f"{p}.mlp.up_proj.weight", (inter, hidden), "BF16"),
        (f"{p}.mlp.down_proj.weight", (hidden, inter), "BF16"),
    ]


def specs(small: bool) -> dict[str, list[list[tuple]]]:
    """typical: 16 layers (416 MiB each) in 8 shards, a 320 MiB embedding in
    the first shard and a 320 MiB lm_head in the last (8.8 % of 7.1 GiB);
    heavy: 8 layers in 8 shards, each shard also holding one tensor as large
    as its layer (416 MiB: 50 % of 6.5 GiB).  Every other tensor is at most
    112 MiB, under the bound.  ``small``: hidden size 256, 1/1024 of the
    bytes, same proportions."""
    hidden = 256 if small else 4096
    row = hidden * 2  # bytes of one BF16 row
    layer_bytes = sum(common.nbytes_of(shape, dtype) for _, shape, dtype in layer(0, small))
    big_rows = (320 * (1024 if small else common.MiB)) // row
    heavy_rows = layer_bytes // row
    typical = [layer(2 * s, small) + layer(2 * s + 1, small) for s in range(8)]
    typical[0].insert(0, ("model.embed_tokens.weight", (big_rows, hidden), "BF16"))
    typical[-1].append(("lm_head.weight", (big_rows, hidden), "BF16"))
    heavy = [
        layer(s, small) + [(f"model.layers.{s}.mlp.experts.packed", (heavy_rows, hidden), "BF16")]
        for s in range(8)
    ]
    return {"typical": typical, "heavy": heavy}


def write_checkpoints(root: Path, small: bool) -> dict:
    import make_checkpoints

    bound = SMALL_BOUND if small else BOUND
    out = {}
    for name, spec in specs(small).items():
        folder = root / name
        written = make_checkpoints.write_sharded(folder, spec, first_index=len(out) * 1000)
        make_checkpoints.write_index(folder, written["weight_map"], written["total_size"])
        sizes = [common.nbytes_of(shape, dtype) for shard in spec for _, shape, dtype in shard]
        out[name] = {
            "dir": str(folder),
            "files": [str(folder / f) for f in written["files"]],
            "payload_bytes": sum(sizes),
            "oversized_bytes": sum(s for s in sizes if s > bound),
            "n_tensors": len(sizes),
        }
    return {"bound": bound, "checkpoints": out}


# --- one rank (child process) ----------------------------------------------------


def load_base_iterator(base_tree: str):
    """The base release's ``instanttensor_weights_iterator``: the base tree's
    weight_utils module, loaded beside the series' (it imports the rest of
    vLLM from the series tree, which the series leaves unchanged there)."""
    path = Path(base_tree) / "vllm" / "model_executor" / "model_loader" / "weight_utils.py"
    spec = importlib.util.spec_from_file_location("base_weight_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.instanttensor_weights_iterator


def wait_for_plan(path: Path, timeout: float) -> dict:
    """The parent writes the plan once the checkpoints are written."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no plan at {path} after {timeout:.0f} s")
        time.sleep(0.2)
    return json.loads(path.read_text())


def rank_main(args: argparse.Namespace) -> int:
    rank = args.rank
    result: dict = {"rank": rank, "loads": {}, "verify": {}, "agreement": None, "rounds": {}}
    out_path = Path(args.work) / f"tp2-rank{rank}.json"

    def save() -> None:
        common.write_json(out_path, result)

    try:
        import torch

        device = "cuda" if args.device == "cuda" else "cpu"
        if device == "cuda":
            torch.cuda.set_device(rank)
        import instanttensor
        from safetensors import safe_open
        from vllm.distributed import get_world_group, init_distributed_environment
        from vllm.model_executor.model_loader import weight_utils
        from vllm.platforms import current_platform

        current_platform.is_cuda = lambda: True
        current_platform.current_device = lambda: rank if device == "cuda" else "cpu"
        if device == "cpu":  # no pinning without a GPU (the pinned reader's arena)
            weight_utils.is_pin_memory_available = lambda: False
            # The ranks compare their free device memory: 64 GiB each.
            torch.cuda.mem_get_info = lambda device=None: (64 << 30, 64 << 30)
        base_iterator = load_base_iterator(args.base_tree)
        plan = wait_for_plan(Path(args.plan), args.plan_timeout)
        init_distributed_environment(
            world_size=2,
            rank=rank,
            distributed_init_method=f"tcp://127.0.0.1:{args.port}",
            local_rank=rank,
            backend="nccl" if device == "cuda" else "gloo",
        )
        world = get_world_group()

        def sync() -> None:
            if device == "cuda":
                torch.cuda.synchronize()

        def go_on(until: float) -> bool:
            """Rank 0's answer, on both ranks: is there time for another round?"""
            answer = [time.time() < until]
            torch.distributed.broadcast_object_list(answer, src=0, group=world.cpu_group)
            return answer[0]

        def per_rank(files):
            with instanttensor.safe_open(
                list(files),
                framework="pt",
                device=current_platform.current_device(),
                process_group=None,
                copy=True,
                tensor_name_match_mode="exact",
            ) as f:
                yield from f.tensors()

        def series(files, **options):
            return weight_utils.instanttensor_weights_iterator(list(files), False, **options)

        bound = plan["bound"]
        configs = {
            BASE_LABEL: lambda f: base_iterator(list(f), False),
            "InstantTensor per rank": per_rank,
            "series, options unset": lambda f: series(f),
            "series COPY=0": lambda f: series(f, copy=False),
            "series bound": lambda f: series(f, buffer_size=bound),
            "series bound, pinned staging": lambda f: series(
                f, buffer_size=bound, pinned_staging=True
            ),
        }
        assert tuple(configs) == CONFIGS

        def load(fn, files: list[str], dests: dict) -> float:
            world.barrier()
            sync()
            t0 = time.perf_counter()
            for name, tensor in fn(files):
                dests[name].copy_(tensor)
            sync()
            return time.perf_counter() - t0

        def as_bytes(t):
            return t.reshape(-1).view(torch.uint8)

        checkpoints = list(plan["checkpoints"].items())
        for index, (ck_name, ck) in enumerate(checkpoints):
            # Each checkpoint gets an equal share of the time left for rounds.
            until = time.time() + (plan["deadline"] - time.time()) / (len(checkpoints) - index)
            reference, dests = {}, {}
            for path in ck["files"]:
                with safe_open(path, framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118
                        reference[name] = f.get_tensor(name).to(device)
                        dests[name] = torch.empty_like(reference[name])
            for label, fn in configs.items():  # verified, untimed
                for d in dests.values():
                    as_bytes(d).fill_(0xA5)
                load(fn, ck["files"], dests)
                bad = [
                    n
                    for n, ref in reference.items()
                    if not torch.equal(as_bytes(dests[n]), as_bytes(ref))
                ]
                result["verify"][f"{ck_name}: {label}"] = bad[:10] or "bitwise equal"
                save()
            labels = list(configs)
            result["rounds"][ck_name] = 0
            for r in range(plan["rounds"]):
                if not go_on(until):
                    break
                for i in range(len(labels)):
                    label = labels[(r + i) % len(labels)]
                    seconds = load(configs[label], ck["files"], dests)
                    result["loads"].setdefault(f"{ck_name}: {label}", []).append(seconds)
                result["rounds"][ck_name] = r + 1
                save()
            del reference, dests
            if device == "cuda":
                torch.cuda.empty_cache()

        # Ranks that disagree on the buffer size must both fail, not hang.
        result["agreement"] = {"raised": "not run: started, did not finish"}
        save()
        os.environ["INSTANTTENSOR_BUFFER_SIZE"] = str(bound if rank == 0 else bound // 2)
        t0 = time.perf_counter()
        try:
            for _ in series(plan["checkpoints"]["typical"]["files"]):
                pass
            result["agreement"] = {"raised": None}
        except ValueError as e:
            result["agreement"] = {"raised": str(e)[:500]}
        result["agreement"]["seconds"] = time.perf_counter() - t0
        del os.environ["INSTANTTENSOR_BUFFER_SIZE"]
    except Exception:
        result["error"] = traceback.format_exc()[-4000:]
    save()
    return 0 if "error" not in result else 1


# --- orchestrator ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_trees(bundle_dir: Path, work: Path, log) -> tuple[Path, Path, Path]:
    """The base and series trees and the wheels' site, as run_all.py leaves
    them; what is missing is unpacked or installed from the bundle."""
    trees = {name: work / "trees" / name for name in ("base", "series")}
    site = work / "site"
    bundle = None
    for name, tree in trees.items():
        if not (tree / "vllm").is_dir():
            log(f"unpacking the {name} tree")
            bundle = bundle or json.loads((bundle_dir / "bundle.json").read_text())
            common.unpack_tree(bundle_dir, bundle, name, tree)
    if not site.is_dir():
        wheels = sorted(str(p) for p in (bundle_dir / "wheels").glob("*.whl"))
        if wheels:
            log(f"installing {len(wheels)} wheels")
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                 "--no-compile", "--target", str(site), *wheels],
                check=True, timeout=180,
            )  # fmt: skip
        site.mkdir(parents=True, exist_ok=True)
    return trees["base"], trees["series"], site


def summarise(plan: dict, ranks: list[dict]) -> dict:
    """Per checkpoint and configuration: the slower rank's median over the
    rounds both ranks timed, ratios to the base and to the unset series."""
    out: dict = {}
    for ck_name in plan["checkpoints"]:
        rows = {}
        for label in CONFIGS:
            key = f"{ck_name}: {label}"
            samples = [r["loads"].get(key, []) for r in ranks]
            n = min(len(s) for s in samples)
            per_round = [max(s[i] for s in samples) for i in range(n)]
            rows[label] = {
                "median_s": statistics.median(per_round) if per_round else None,
                "samples_s": per_round,
                "verified": all(r["verify"].get(key) == "bitwise equal" for r in ranks),
                "verify": [r["verify"].get(key) for r in ranks],
            }
        for row in rows.values():
            row["x_base"] = common.ratio(row["median_s"], rows[BASE_LABEL]["median_s"])
            row["x_series_unset"] = common.ratio(
                row["median_s"], rows["series, options unset"]["median_s"]
            )
        out[ck_name] = rows
    return out


def evaluate(res: dict) -> list[dict]:
    """The two-GPU targets: bounded loading on the typical checkpoint against
    the base's collective load, and both ranks failing alike, quickly, when
    their bounds differ."""
    targets = []
    typical = res.get("results", {}).get("typical", {})
    for label in ("series bound", "series bound, pinned staging"):
        value = typical.get(label, {}).get("x_base")
        targets.append(
            {
                "name": f"typical: {label} / base collective",
                "target": f"<= {TARGET}",
                "value": value,
                "met": value is not None and value <= TARGET,
            }
        )
    agreement = res.get("agreement") or []
    raised = {a.get("raised") for a in agreement}
    slowest = max((a.get("seconds") or 0 for a in agreement), default=None)
    targets.append(
        {
            "name": "different bounds: the same error on both ranks (slower rank, s)",
            "target": f"<= {AGREEMENT_SECONDS}",
            "value": slowest,
            "met": len(agreement) == 2
            and len(raised) == 1
            and None not in raised
            and "disagree" in next(iter(raised))
            and slowest <= AGREEMENT_SECONDS,
        }
    )
    return targets


def wait_ranks(procs: list[subprocess.Popen], deadline: float, res: dict) -> None:
    """Until both ranks end; a rank that outlives the budget, or the other
    rank's failure by GRACE_SECONDS, is stopped."""
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + GRACE_SECONDS):
            why = "the budget is spent" if now > deadline else "the other rank failed"
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    res["problems"].append(f"rank {rank} stopped: {why}")
                    kill(p)
            return
        time.sleep(0.5)


def tmpfs(shm: Path, work: Path, small: bool, log) -> Path:
    """An empty folder for the checkpoints: /dev/shm/tp2, or a tmpfs mounted
    under the work folder when /dev/shm lacks room (``small``: as given)."""
    shutil.rmtree(shm, ignore_errors=True)
    shm.mkdir(parents=True)
    free = shutil.disk_usage(shm).free / common.GiB
    if small or free >= SHM_GIB:
        return shm
    shm.rmdir()
    mount = work / "tp2-shm"
    mount.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={SHM_GIB + 2}g", "tmpfs", str(mount)]
    rc = subprocess.run(cmd, capture_output=True, text=True)
    log(f"/dev/shm has {free:.1f} GiB free: mounted a tmpfs at {mount}: rc={rc.returncode}")
    if rc.returncode:
        raise RuntimeError(f"no room for the checkpoints: {rc.stderr.strip()}")
    return mount


def kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", default=".device")
    parser.add_argument("--work", default="/tmp/qual")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/qual-out"))
    parser.add_argument("--budget", type=float, default=420)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="tiny checkpoints (tests)")
    parser.add_argument(
        "--extra-path", action="append", default=[], help="prepended to PYTHONPATH (tests)"
    )
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--plan-timeout", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--base-tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        return rank_main(args)

    t_start = time.monotonic()
    deadline = t_start + args.budget
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log_file = (out / "tp2.log").open("a")

    def log(msg: str) -> None:
        line = f"[{time.monotonic() - t_start:6.1f}s] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    res: dict = {"command": COMMAND, "argv": sys.argv[1:], "configs": list(CONFIGS), "problems": []}
    shm = Path("/dev/shm/tp2") if not args.small else work / "tp2-checkpoints"
    procs: list[subprocess.Popen] = []
    try:
        base_tree, tree, site = ensure_trees(Path(args.bundle).resolve(), work, log)
        shm = tmpfs(shm, work, args.small, log)
        plan_path = work / "tp2-plan.json"
        plan_path.unlink(missing_ok=True)
        env = common.env_without_managed() | NCCL_ENV
        env["PYTHONPATH"] = ":".join([*args.extra_path, str(tree), str(site)])
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if args.small:  # InstantTensor refuses a bound below chunk x world size
            env["INSTANTTENSOR_CHUNK_SIZE"] = str(SMALL_BOUND // 8)
        rank_log = (work / "tp2-ranks.log").open("w")
        port = free_port()
        # The ranks import vLLM while the checkpoints are written.
        for rank in range(2):
            (work / f"tp2-rank{rank}.json").unlink(missing_ok=True)
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--rank", str(rank), "--plan", str(plan_path),
                     "--plan-timeout", str(args.budget), "--port", str(port),
                     "--base-tree", str(base_tree), "--work", str(work), "--device", args.device],
                    env=env, stdout=rank_log, stderr=subprocess.STDOUT, start_new_session=True,
                )
            )  # fmt: skip
        t0 = time.monotonic()
        plan = write_checkpoints(shm, args.small)
        log(f"checkpoints written in {time.monotonic() - t0:.1f} s: " + json.dumps(
            {k: {kk: v[kk] for kk in ("payload_bytes", "oversized_bytes", "n_tensors")}
             for k, v in plan["checkpoints"].items()}
        ))  # fmt: skip
        # Rounds start while there is time for one more and the agreement check.
        plan.update(rounds=args.rounds, deadline=time.time() + (deadline - time.monotonic()) * 0.7)
        common.write_json(plan_path, plan)
        res["checkpoints"], res["bound_bytes"] = plan["checkpoints"], plan["bound"]
        wait_ranks(procs, deadline, res)
        ranks = []
        for rank in range(2):
            path = work / f"tp2-rank{rank}.json"
            ranks.append(json.loads(path.read_text()) if path.exists() else {"error": "no result"})
        res["ranks"] = ranks
        for r in ranks:
            if "error" in r:
                res["problems"].append(f"rank {r.get('rank', '?')} failed: {r['error'][-1500:]}")
        if all("loads" in r for r in ranks):
            res["rounds"] = ranks[0]["rounds"]
            res["results"] = summarise(plan, ranks)
            if all(r["agreement"] for r in ranks):
                res["agreement"] = [r["agreement"] for r in ranks]
            for ck_name, rows in res["results"].items():
                for label, row in rows.items():
                    if not row["verified"]:
                        res["problems"].append(
                            f"{ck_name} {label}: not bitwise equal {row['verify']}"
                        )
                    if row["median_s"] is None:
                        res["problems"].append(f"{ck_name} {label}: no timed round")
    except Exception:
        res["problems"].append(traceback.format_exc()[-3000:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill(proc)
        if (work / "tp2-ranks.log").exists():
            log_file.write((work / "tp2-ranks.log").read_text(errors="replace")[-1_000_000:])
        if not args.small:
            shutil.rmtree(shm, ignore_errors=True)
    res["targets"] = evaluate(res)
    if not res["targets"][-1]["met"]:
        res["problems"].append(f"ranks with different bounds: {res.get('agreement')}")
    res["wall_seconds"] = round(time.monotonic() - t_start, 1)
    res["status"] = "pass" if not res["problems"] else "fail"
    common.write_json(out / "tp2.json", res)
    fmt = lambda v, d=2: "–" if v is None else f"{v:.{d}f}"  # noqa: E731
    for ck_name, rows in res.get("results", {}).items():
        for label, row in rows.items():
            log(
                f"{ck_name:8} {label:34} {fmt(row['median_s'], 3)} s  x base "
                f"{fmt(row['x_base'])}  x series unset {fmt(row['x_series_unset'])}  "
                f"verified {row['verified']}"
            )
    for a in res.get("agreement") or []:
        log(f"agreement: {a}")
    for t in res["targets"]:
        verdict = "MET" if t["met"] else "missed"
        log(f"target {t['name']}: {fmt(t['value'])} ({t['target']}) {verdict}")
    for p in res["problems"]:
        log(f"PROBLEM {p[:1500]}")
    log(f"STATUS {res['status']} wall {res['wall_seconds']} s")
    return 0 if not res["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
