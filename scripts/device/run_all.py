"""Qualify the series on one GPU: tests, real-writer check, benchmarks.

Copy ``scripts/device`` and ``.device/`` (``make device-bundle`` builds it)
to the GPU machine and run ``bash scripts/device/run_all.sh`` from there.  Writes to
``$OUT`` (six files, at its top level):

  qualification.json  every figure, test count, version and verdict
  summary.md          the tables, the targets, the problems
  qualification.png   throughput, bounded staging, deferred memory, pinned reads
  run.log             this script's own log, machine facts, wheel install
  pytest.log          the GPU test runs (series tests, negative controls)
  bench.log           checkpoint writer and benchmark workers' output

The two-GPU measurements are ``tp2.py``'s (a two-GPU machine; it reuses the
trees and wheels this script leaves under ``--work``, and adds ``tp2.json``
and ``tp2.log`` to ``$OUT``).

Every step has its own time limit and the whole run a budget (``--budget``,
default 540 s), so one hang cannot hold the run past its budget: a step that
runs out is killed, recorded, and the run goes on to write its evidence.
Each benchmark also has its share of the budget (``PHASE_SECONDS``): past it,
it starts no new round, so the later benchmarks still run.

Order: install wheels and unpack trees; start, in the background, the
checkpoint writer (CPU only) and one benchmark worker per tree (each imports
vLLM once); run the series' tests on the patched tree (GPU), then each
negative control; then the benchmarks, each base/series comparison
interleaved between the workers, and the report:

  real_writer  a Qwen3-MoE written by transformers, bitwise, in every loader
               mode (kept or compared inline, bound, pinned staging, priority)
  throughput   ~8 GiB from tmpfs: base, series COPY=1/0, COPY=0 without the
               retention check (its cost), an A/A repeat, pinned H2D ceiling;
               at least 10 interleaved rounds, median and best round x base
  staging      the same + one 1 GiB tensor, 64 MiB bound: pageable fallback
               against pinned staging, time x unbounded, ring, peak memory
  heavy        43 % of the bytes above the bound: the same comparison
  deferred     layerwise online processing, whole and as rank 0 of 8 (TP-like)
  pinned_read  one 1 GiB tensor to the GPU: pageable, and the pinned reader
               over threads x chunk sizes (which default is fastest)
  many         116,000 tensors of 16 KiB in 100 shards, 4 interleaved rounds
               (``--many-rounds``): base, series options unset (copy) and
               copy false (borrowed): seconds, median and best round x base,
               first tensor, us per tensor.  ``--many-configs all`` adds
               borrowed with a consumer that keeps a tensor it owns, bounded,
               bounded + pinned staging, the base at the bound, and the
               retention check's cost with that consumer at stack depth 1 and
               60 (20 of the shards)
  disk         the disk checkpoint (5 GiB) on the machine's own disk, page
               cache dropped before every load: base, series unbounded,
               256 MiB and 1 GiB bounds; time, backend, io depth
  draft        a draft (lm_head 163840 x 7168 + one dense layer, 3.3 GiB)
               after its target filled the GPU to 4 GiB, then 1 GiB free:
               options unset against vLLM's safetensors loader; outcome,
               bitwise, time, peak extra, ring
  kimi         embed_tokens and lm_head (163840 x 7168) above a 256 MiB
               bound, the rest dense: bounded pinned, copy and borrowed,
               x unbounded
  tuning       InstantTensor's own knobs (skipped unless ``--skip`` omits it)
  bound        the series (tensors above ``instanttensor_buffer_size`` B on
               CPU, the others whole through InstantTensor's ring of B)
               against the series with pieces (the bundle's optional
               ``pieces`` tree, v4-style: scripts/device/add_tree.sh), rows
               interleaved, staging and heavy checkpoints, B = 64 and 256 MiB,
               copy and borrowed, pinned staging on, each tree unbounded, and
               the series at the geometry rule's B (twice the largest tensor
               that stays on the GPU): load time (median, best of 5 rounds),
               x the same tree unbounded, x pieces, ring, peak extra GPU memory
               (mem_get_info after every tensor), every tensor bitwise
               (skipped unless selected: ``--only bound``)

``--only many`` runs one benchmark alone (no tests; only its checkpoint is
written): ``bash scripts/device/run_all.sh --only many``, about 3 minutes.

The bound comparison with the tests and the other phases, in one call of
about 470 s (a 540 s budget; PHASE_SECONDS says where it goes):

  bash scripts/device/run_all.sh --only tests,bound,deferred,many,throughput --budget 540
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
import report  # noqa: E402

COMMAND = "bash scripts/device/run_all.sh"
PY = sys.executable


class Run:
    """Log, deadline and results of one qualification run."""

    def __init__(self, out: Path, work: Path, budget: float):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget
        self.out, self.work = out, work
        self.series_mode = True
        self.log_file = (out / "run.log").open("a")
        self.res: dict = {
            "schema": 1,
            "command": COMMAND,
            "argv": sys.argv[1:],
            "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "phases": {},
            "problems": [],
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, msg: str, echo: bool = True) -> None:
        line = f"[{self.elapsed():6.1f}s] {msg}"
        self.log_file.write(line + "\n")
        self.log_file.flush()
        if echo:
            print(line, flush=True)

    def problem(self, msg: str) -> None:
        self.res["problems"].append(msg)
        self.log(f"PROBLEM: {msg}")

    def limit(self, wanted: float, reserve: float = 25) -> float:
        """A step's time limit: what it wants, within what the budget leaves."""
        return max(5.0, min(wanted, self.left() - reserve))

    def step(
        self,
        name: str,
        cmd: list[str],
        timeout: float,
        log_path: Path,
        env: dict | None = None,
        cwd: Path | None = None,
    ) -> dict:
        """Run one command with its own time limit; its output goes to log_path."""
        timeout = self.limit(timeout)
        with log_path.open("a") as f:
            f.write(f"\n===== {name}: {' '.join(map(str, cmd))}\n")
            f.flush()
            t0 = time.monotonic()
            proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
            timed_out = False
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc)
                rc = proc.wait()
            seconds = time.monotonic() - t0
            f.write(
                f"===== {name}: rc={rc} in {seconds:.1f} s"
                f"{f' (TIMED OUT after {timeout:.0f} s)' if timed_out else ''}\n"
            )
        info = {
            "rc": rc,
            "seconds": round(seconds, 1),
            "timed_out": timed_out,
            "limit_s": round(timeout),
        }
        self.res["phases"][name] = info
        self.log(f"{name}: rc={rc} {seconds:.1f}s{' TIMED OUT' if timed_out else ''}")
        return info


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


EXTRA_PATH: list[str] = []  # --extra-path (tooling tests: a stand-in instanttensor)


def tree_env(tree: Path, site: Path) -> dict:
    env = common.env_without_managed()
    env["PYTHONPATH"] = ":".join([*EXTRA_PATH, str(tree), str(site)])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if "chunk" in SIZES:
        env[common.SMALL_CHUNK_ENV] = str(SIZES["chunk"])
    return env


# --- workers -------------------------------------------------------------------


class Worker:
    """A worker.py process for one tree; JSON commands in, JSON results out."""

    def __init__(self, run: Run, name: str, tree: Path, site: Path, device: str):
        self.run, self.name, self.dead = run, name, False
        self.tree_label = name
        self.log_path = run.work / f"worker-{name}.log"
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [
                PY,
                str(HERE / "worker.py"),
                "--tree",
                name,
                "--result-fd",
                str(write_fd),
                "--device",
                device,
            ],
            stdin=subprocess.PIPE,
            stdout=self.log_path.open("w"),
            stderr=subprocess.STDOUT,
            env=tree_env(tree, site),
            cwd=run.work,
            pass_fds=(write_fd,),
            text=True,
            start_new_session=True,
        )
        os.close(write_fd)
        self.results: queue.Queue = queue.Queue()
        reader = os.fdopen(read_fd)
        threading.Thread(target=self._read, args=(reader,), daemon=True).start()
        self.ready: dict | None = None

    def _read(self, reader) -> None:
        for line in reader:
            try:
                self.results.put(json.loads(line))
            except json.JSONDecodeError:
                self.results.put({"error": f"bad result line: {line[:200]}"})
        self.results.put({"error": "worker exited", "eof": True})

    def wait_ready(self, timeout: float) -> dict:
        if self.ready is None:
            try:
                self.ready = self.results.get(timeout=max(1.0, timeout))
            except queue.Empty:
                self.ready = {"ready": False, "error": f"not ready after {timeout:.0f} s"}
            if not self.ready.get("ready"):
                self.dead = True
                self.run.problem(
                    f"worker {self.name} failed to start: {str(self.ready.get('error'))[-800:]}"
                )
        return self.ready

    def call(self, op: str, timeout: float = 90, **kwargs) -> dict:
        if self.dead:
            return {"error": f"worker {self.name} is not running"}
        timeout = self.run.limit(timeout, reserve=15)
        try:
            self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
            self.proc.stdin.flush()
            result = self.results.get(timeout=timeout)
        except (BrokenPipeError, OSError) as e:
            result = {"error": f"worker {self.name}: {e}"}
        except queue.Empty:
            result = {"error": f"worker {self.name}: {op} timed out after {timeout:.0f} s"}
            self.run.problem(result["error"])
            self.stop()
        if result.get("eof"):
            self.dead = True
        if "error" in result:
            self.run.log(f"  {self.name} {op}: ERROR {result['error'][-300:]}", echo=True)
        return result

    def stop(self) -> None:
        if self.proc.poll() is None and not self.dead:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            kill_group(self.proc)
            self.proc.wait()
        self.dead = True


# --- phases --------------------------------------------------------------------------


def machine_facts(run: Run, shm_root: Path) -> dict:
    facts: dict = {}

    def sh(*cmd) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"unavailable: {e}"

    q = sh(
        "nvidia-smi",
        "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
        "--format=csv,noheader",
    )
    parts = [p.strip() for p in q.split(",")]
    if len(parts) >= 2:
        facts["gpu_smi"], facts["driver"] = parts[0], parts[1]
        facts["gpu_memory_smi"] = parts[2] if len(parts) > 2 else None
    header = sh("nvidia-smi")
    if "CUDA Version:" in header:
        facts["driver_cuda"] = header.split("CUDA Version:")[1].split()[0]
    facts["kernel"] = sh("uname", "-r")
    facts["nproc"] = os.cpu_count()
    meminfo = Path("/proc/meminfo").read_text().splitlines()[:3]
    facts["meminfo"] = [" ".join(m.split()) for m in meminfo]
    for tool in ("git", "patch", "tar", "xz"):
        facts[f"which_{tool}"] = shutil.which(tool)
    try:
        st = os.statvfs(shm_root if shm_root.exists() else "/dev/shm")
        facts["shm_free_gib"] = round(st.f_bavail * st.f_frsize / common.GiB, 1)
        facts["shm_total_gib"] = round(st.f_blocks * st.f_frsize / common.GiB, 1)
    except OSError as e:
        facts["shm_free_gib"] = f"unavailable: {e}"
    facts["python"] = sys.version.split()[0]
    facts["python_lzma"] = importlib.util.find_spec("lzma") is not None
    facts["pytest_timeout"] = importlib.util.find_spec("pytest_timeout") is not None
    run.log("machine: " + json.dumps(facts))
    return facts


# tmpfs the checkpoints take: synthetic 7.9 GiB, staging's and heavy's new
# 1 GiB tensors 4 GiB (the rest are hard links), layered 1.4, real 0.4,
# many 1.9 (many-part: hard links).
SHM_GIB = 26  # + draft 3.3, kimi's embed_tokens 2.2 (its lm_head: the draft's, linked)
DISK_GIB = 8  # the disk checkpoint, 5 GiB, on the machine's own disk


def choose_shm(run: Run, wanted_gib: float) -> Path:
    """A tmpfs folder for the checkpoints: /dev/shm when it has room, else a
    tmpfs mounted under the work folder (recorded)."""
    st = os.statvfs("/dev/shm")
    free = st.f_bavail * st.f_frsize / common.GiB
    if free >= wanted_gib:
        root = Path("/dev/shm/qual")
    else:
        root = run.work / "shm"
        root.mkdir(parents=True, exist_ok=True)
        rc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={int(wanted_gib) + 2}g", "tmpfs", str(root)],
            capture_output=True,
            text=True,
        )
        run.problem(
            f"/dev/shm has {free:.1f} GiB free (< {wanted_gib}); mounted a tmpfs"
            f" at {root}: rc={rc.returncode} {rc.stderr.strip()}"
        )
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    return root


def choose_disk(run: Run, work: Path) -> Path:
    """A folder on the machine's own disk (not a tmpfs) with ``DISK_GIB``
    free: the first of /var/tmp, $HOME and /tmp (recorded)."""
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    for cand in ("/var/tmp", os.environ.get("HOME", "/root"), "/tmp"):
        path = Path(cand)
        if not path.is_dir():
            continue
        real = str(path.resolve())
        fs = max((m for m in mounts if real.startswith(m[1].rstrip("/") + "/") or real == m[1]),
                 key=lambda m: len(m[1]), default=["?", "/", "?"])  # fmt: skip
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize / common.GiB
        if fs[2] not in ("tmpfs", "ramfs") and free >= DISK_GIB:
            run.res["disk"] = {"folder": str(path / "qual-disk"), "fs": fs[2],
                               "device": fs[0], "free_gib": round(free, 1)}  # fmt: skip
            return path / "qual-disk"
    run.problem(f"no folder on a disk with {DISK_GIB} GiB free: the disk rows read {work}")
    return work / "disk-root"


def run_pytest(
    run: Run, name: str, tree: Path, site: Path, files: list[str], timeout: float, facts: dict
) -> dict:
    junit = run.work / f"junit-{name.replace(' ', '-')}.xml"
    junit.unlink(missing_ok=True)
    cmd = [
        PY,
        "-m",
        "pytest",
        "--noconftest",
        # -rsP: skip reasons, and what passing tests printed (e.g. the peak
        # GPU memory figures the 0009 test prints side by side).
        "-rsP",
        "-v",
        "-p",
        "no:cacheprovider",
        "-o",
        "junit_family=xunit1",
        f"--junitxml={junit}",
    ]
    if facts.get("pytest_timeout"):
        cmd.append("--timeout=150")
    cmd += files
    info = run.step(name, cmd, timeout, run.out / "pytest.log", env=tree_env(tree, site), cwd=tree)
    parsed = report.parse_junit(junit)
    parsed.update(rc=info["rc"], timed_out=info["timed_out"], seconds=info["seconds"])
    t = parsed.get("totals", {})
    run.log(
        f"  {name}: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, "
        f"{t.get('error', 0)} errors, {t.get('skipped', 0)} skipped"
    )
    return parsed


def interleaved(configs: list, rounds: int):
    """(round, config) in rotated order: each round starts one config later."""
    n = len(configs)
    for r in range(rounds):
        for i in range(n):
            yield r, configs[(r + i) % n]


CPU_ONLY = {"test_models_keeping_weights.py", "test_model_loading.py"}
SLOW_REPEATS = 3  # vLLM's safetensors path takes ~2 s a load: fewer rounds
IT = "instanttensor"
PINNED = {"instanttensor_pinned_staging": True}
# Borrowed mode ("COPY=0" rows): the series reads it from this loader option
# alone (copies are its default, "COPY=1" rows pass nothing).  The base
# rejects the key: base rows never get it, and a smoke run lists the series
# rows that need it as not run (``runnable``).
COPY_FALSE = {"instanttensor_copy": False}
PRIORITY = ["model.embed_tokens.", "lm_head."]

# The staging bound of the bounded benchmarks, the real-writer check's, and
# the parameters of the processed layer (``--small``: scaled down with the
# checkpoints, so that the same tensors fall back to CPU).
SIZES = {
    "bound": 64 * common.MiB,
    "bound_large": 256 * common.MiB,
    "real_bound": 32 * common.MiB,
    "layer_shape": [4096, 4096],
}
SMALL_SIZES = {
    "bound": common.MiB,
    "bound_large": 2 * common.MiB,
    "real_bound": common.MiB // 2,
    "layer_shape": [256, 256],
    "chunk": 64 * 1024,  # InstantTensor refuses a bound below one chunk
}

# Each benchmark's share of the budget (seconds): a phase stops starting new
# rounds when its share is spent, so that the later ones still run.  With
# ``--small`` (CPU tests on a shared machine) the shares are SMALL_SCALE times
# as long: there the budget alone bounds the run.  On the H200 (v5 run) the
# tests took 122 s (series 88, negative control 34), a throughput round
# 1.7 s, a bounded load 0.3-0.9 s, and a ``many`` row 11.6 s a load; a
# verified load reads the checkpoint once per worker (4 s), then 0.5 s.
# ``--only tests,bound,deferred,many,throughput --budget 540``: tests ~125 s,
# throughput ~35, bound ~100, deferred ~35, many 4 rounds of the three mode
# rows ~150: about 460 s of the 540.
# The default run (one GPU, the shipped patches): setup ~40 s, tests ~125 s,
# then the shares below (soft: a phase starts no round past its share):
# about 530 s in all, within the 540 s budget and a 10-minute call.
SMALL_SCALE = 4
PHASE_SECONDS = {
    "real_writer": 20,
    "throughput": 30,
    "staging": 30,
    "heavy": 30,
    "deferred": 30,
    "pinned_read": 15,
    "disk": 45,
    "draft": 25,
    "kimi": 30,
    "many": 160,
    "tuning": 30,
    "bound": 120,
}
# The checkpoints, in the order they are written, and those each phase reads
# (staging and heavy link synthetic's shards).
KINDS = ("synthetic", "staging", "heavy", "layered", "real", "many", "draft", "kimi", "disk")
CHECKPOINTS = {
    "real_writer": ["real"],
    "throughput": ["synthetic"],
    "staging": ["synthetic", "staging"],
    "heavy": ["synthetic", "heavy"],
    "deferred": ["layered"],
    "pinned_read": ["synthetic", "staging"],
    "many": ["many"],
    "disk": ["synthetic", "staging", "disk"],
    "draft": ["draft"],
    "kimi": ["synthetic", "draft", "kimi"],
    "tuning": ["synthetic"],
    "bound": ["synthetic", "staging", "heavy"],
}


def runnable(run: Run, configs: list, out: dict, W: dict | None = None) -> list:
    """The configurations this bundle can run.  Without a series (a smoke
    run, the series rows on the base tree) the ones that need the series'
    loader settings are listed under ``not_run`` instead, and so are those
    of a tree the bundle lacks (``W``: the workers, when given)."""
    keep = []
    for config in configs:
        label, wname, kw = config[0], config[1], config[2]
        if W is not None and wname not in W:
            out.setdefault("not_run", []).append(f"{label} (the bundle has no {wname} tree)")
        elif not run.series_mode and wname == "series" and kw.get("extra"):
            out.setdefault("not_run", []).append(f"{label} (needs the series)")
        else:
            keep.append(config)
    return keep


ROUND_STARTED: dict[str, float] = {}


def phase_over(run: Run, until: float, name: str, out: dict, rnd: int, min_rounds: int = 0) -> bool:
    """Whether a phase must stop starting rounds: its share of the budget is
    spent (after ``min_rounds`` rounds), or a round as long as the last one
    would leave less than 45 s of the budget.  The medians then rest on
    fewer rounds, which ``out["rounds"]`` says; a phase that timed nothing
    is a problem."""
    now = time.monotonic()
    last_round = now - ROUND_STARTED[name] if rnd else 0.0
    ROUND_STARTED[name] = now
    if (now < until or rnd < min_rounds) and run.left() - last_round >= 45:
        return False
    why = "its share of the budget" if now >= until else "the time budget"
    run.log(f"{name}: stopped before round {rnd + 1} of {out['repeats']} ({why} spent)")
    if rnd == 0:
        run.problem(f"{name}: no timed round ran ({why} spent)")
    return True


TP = 8  # the TP-like deferred runs: rank 0 of 8
VERIFY_KEYS = ("n_mismatches", "mismatches", "names_ok", "duplicates", "missing", "error")


def verified_load(run: Run, W: dict, phase: str, label: str, wname: str, kw: dict) -> dict:
    """One untimed load that compares every tensor, bitwise, with the file."""
    r = W[wname].call("load", verify=True, **kw)
    if r.get("n_mismatches") or not r.get("names_ok", False):
        summary = {k: r.get(k) for k in VERIFY_KEYS}
        run.problem(
            f"{phase} {label}: loaded tensors differ from the checkpoint: "
            f"{json.dumps(summary)[:400]}"
        )
    return r


THROUGHPUT_MIN_ROUNDS = 4  # past the phase's share, while the budget allows


def bench_throughput(run: Run, W: dict, ck: dict, repeats: int, until: float) -> dict:
    """Interleaved rounds: base, series COPY=1/0, COPY=0 without the retention
    check (its cost), an A/A repeat of the base (its ratio to the base is the
    noise floor of the comparison), vLLM's plain safetensors path (first
    rounds only) and the pinned 1 GiB H2D ceiling.  At least
    ``THROUGHPUT_MIN_ROUNDS`` rounds (``repeats`` permitting) even past the
    phase's share; each row's median and best round against the base's."""
    folder = ck["synthetic"]["dir"]
    # COPY=1: the series' default (copies); COPY=0: loader option
    # ``instanttensor_copy`` false (borrowed), which the series alone accepts.
    borrowed = {"format": IT, "env": {}, "extra": COPY_FALSE}
    configs = [
        ("base InstantTensor", "base", {"format": IT, "env": {}}),
        ("series COPY=1", "series", {"format": IT, "env": {}}),
        ("series COPY=0", "series", borrowed),
        ("series COPY=0, retention check off", "series", {**borrowed, "retention_check": False}),
        ("base InstantTensor (A/A repeat)", "base", {"format": IT, "env": {}}),
        ("vLLM safetensors + copy to GPU", "base", {"format": "safetensors", "env": {}}),
    ]
    out: dict = {
        "dir": folder,
        "checkpoint_gib": ck["synthetic"]["payload_bytes"] / common.GiB,
        "n_tensors": ck["synthetic"]["n_tensors"],
        "repeats": repeats,
        "rounds": 0,
        "configs": {},
        "order": [],
    }
    configs = runnable(run, configs, out)
    runs: dict[str, list] = {label: [] for label, _, _ in configs}
    verify: dict[str, dict] = {}
    for label, wname, kw in configs:  # warm-up + bitwise check, untimed
        if not label.endswith("(A/A repeat)"):
            r = verified_load(run, W, "throughput", label, wname, {"dir": folder, **kw})
            verify[label] = {k: r.get(k) for k in (*VERIFY_KEYS, "seconds")}
    pinned, pageable = [], []
    schedule = [*configs, ("pinned", "base", None)]
    for rnd, (label, wname, kw) in interleaved(schedule, repeats):
        if label == schedule[rnd % len(schedule)][0]:
            if phase_over(run, until, "throughput", out, rnd, THROUGHPUT_MIN_ROUNDS):
                break
            out["rounds"] = rnd + 1
        if kw is not None and kw["format"] == "safetensors" and rnd >= SLOW_REPEATS:
            continue
        out["order"].append(label)
        if kw is None:
            r = W[wname].call("pinned", size=common.GiB, reps=3)
            if "error" not in r:
                pinned.append(common.median(r["seconds"]["pinned"]))
                pageable.append(common.median(r["seconds"]["pageable"]))
            continue
        runs[label].append(W[wname].call("load", dir=folder, **kw))
    out["pinned_gib_s"] = common.gib_per_s(common.GiB, common.median(pinned))
    out["pinned_gb_s"] = common.GiB / 1e9 / common.median(pinned) if pinned else None
    out["pageable_gib_s"] = common.gib_per_s(common.GiB, common.median(pageable))
    out["pageable_gb_s"] = common.GiB / 1e9 / common.median(pageable) if pageable else None
    out["pinned_samples_s"], out["pageable_samples_s"] = pinned, pageable
    for label, wname, _ in configs:
        s = report.summarise_loads(runs[label])
        s["tree"] = W[wname].tree_label
        s["verify"] = verify.get(label, verify.get("base InstantTensor"))
        s["ratio_vs_pinned"] = common.ratio(s["gib_s"], out["pinned_gib_s"])
        out["configs"][label] = s
    base = out["configs"]["base InstantTensor"]
    for s in out["configs"].values():
        s["ratio_vs_base"] = common.ratio(s["gib_s"], base["gib_s"])
        # Time, best round against the base's best round (interference only adds time).
        s["time_ratio_best"] = common.ratio(s["min_s"], base["min_s"])
    # Below 1: the check costs that fraction of the borrowed-mode throughput.
    out["retention_check_ratio"] = common.ratio(
        out["configs"].get("series COPY=0", {}).get("gib_s"),
        out["configs"].get("series COPY=0, retention check off", {}).get("gib_s"),
    )
    return out


def bounded_configs(kind: str) -> list:
    """The bounded-staging configurations of the ``staging`` checkpoint (the
    synthetic one and one 1 GiB tensor) or the ``heavy`` one."""
    bound = {"INSTANTTENSOR_BUFFER_SIZE": str(SIZES["bound"])}
    # Where the rest of a bounded load's time goes: InstantTensor cannot read
    # ahead in a ring less than twice its largest tensor (56 MiB matrices in
    # a 64 MiB ring); smaller I/O chunks or a twice larger bound show it.
    # The other ring policy (tensors above half the bound on CPU, so that the
    # ring always holds two: worker.ring_policy, op "load" with half_bound) was
    # measured against this one in qualification/h200-ring-policy/.
    double = {"INSTANTTENSOR_BUFFER_SIZE": str(2 * SIZES["bound"])}
    series = [
        ("series bound", "series", {"env": bound}),
        ("series bound, pinned staging", "series", {"env": bound, "extra": PINNED}),
        (
            "series bound, pinned staging, borrowed",
            "series",
            {"env": bound, "extra": {**PINNED, **COPY_FALSE}},
        ),
        ("series 2x bound, pinned staging", "series", {"env": double, "extra": PINNED}),
        ("series unbound", "series", {"env": {}}),
    ]
    if kind == "staging":
        return [("base bound", "base", {"env": bound}), *series, ("base unbound", "base", {})]
    return [("base unbound", "base", {"env": {}}), *series]


BOUNDED_REPEATS = 3  # timed rounds of the bounded benchmarks


def bench_bounded(
    run: Run,
    W: dict,
    ck: dict,
    kind: str,
    until: float,
    configs: list | None = None,
    repeats: int = BOUNDED_REPEATS,
) -> dict:
    """A staging bound (``SIZES["bound"]``): base and series, unbounded,
    bounded with the pageable CPU fallback, bounded with pinned staging.  One
    verified load per configuration (it counts for memory, not time), then
    interleaved timed rounds.  Time is compared with the same tree unbounded;
    the CPU-fallback rate is timed to the end of the consumer's GPU copy."""
    info = ck[kind]
    folder = info["dir"]
    sizes = common.tensor_sizes([str(Path(folder) / f) for f in info["files"]])
    out: dict = {
        "dir": folder,
        "bound_bytes": SIZES["bound"],
        "largest_on_gpu_bytes": max((n for n in sizes.values() if n <= SIZES["bound"]), default=0),
        "checkpoint_gib": info["payload_bytes"] / common.GiB,
        "big_tensor": info.get("big_tensor"),
        "oversized_fraction": info.get("oversized_fraction"),
        "repeats": repeats,
        "rounds": 0,
        "configs": {},
    }
    configs = runnable(run, configs or bounded_configs(kind), out, W)
    runs: dict[str, list] = {label: [] for label, _, _ in configs}
    verify = {}
    for label, wname, kw in configs:
        r = verified_load(run, W, kind, label, wname, {"dir": folder, **kw})
        verify[label] = {k: r.get(k) for k in (*VERIFY_KEYS, "warnings", "readers")}
        runs[label].append(r)
    timed: dict[str, list] = {label: [] for label, _, _ in configs}
    for rnd, (label, wname, kw) in interleaved(configs, repeats):
        if label == configs[rnd % len(configs)][0]:
            if phase_over(run, until, kind, out, rnd):
                break
            out["rounds"] = rnd + 1
        timed[label].append(W[wname].call("load", dir=folder, **kw))
    for label, wname, kw in configs:
        s = report.summarise_loads(timed[label] or runs[label])
        everything = [r for r in runs[label] + timed[label] if "error" not in r]
        s["peak_used_delta"] = max((r["peak_used_delta"] for r in everything), default=None)
        s["torch_peak_delta"] = max((r["torch_peak_delta"] for r in everything), default=None)
        s["peak_host_delta"] = max((r.get("peak_host_delta", 0) for r in everything), default=None)
        rings = [rd["buffer_size"] for r in everything for rd in r.get("readers", [])]
        s["readers_seen"] = [rd for r in everything for rd in r.get("readers", [])][:8]
        s["ring_bytes"] = max(rings, default=None)
        s["tree"] = W[wname].tree_label
        s["tree_has_pieces"] = any(r.get("tree_has_pieces") for r in everything)
        s["verify"] = verify[label]
        env_bound = (kw.get("env") or {}).get("INSTANTTENSOR_BUFFER_SIZE")
        s["bound_bytes"] = (kw.get("extra") or {}).get("instanttensor_buffer_size") or (
            int(env_bound) if env_bound else None
        )
        s["borrowed"] = (kw.get("extra") or {}).get("instanttensor_copy") is False
        out["configs"][label] = s
    for label, s in out["configs"].items():
        unbound = out["configs"].get(f"{label.split()[0]} unbound", {})
        s["ratio_vs_unbound"] = common.ratio(s["median_s"], unbound.get("median_s"))
        s["ratio_best_vs_unbound"] = common.ratio(s["min_s"], unbound.get("min_s"))
    return out


# The bound phase: the series as it is (tensors above the bound on CPU, the
# others whole through InstantTensor's ring of the bound) against the series
# with "large tensors stream through a bounded ring in pieces" (v4/v5, the
# bundle's optional ``pieces`` tree: scripts/device/add_tree.sh).
BOUND_TREES = ("series", "pieces")
BOUND_PHASE_REPEATS = 5


size_label = report.size_label


def bound_configs(kind: str, geometry: int) -> list:
    """Rows of the ``bound`` phase on one checkpoint: each tree unbounded; at
    ``SIZES["bound"]`` and ``SIZES["bound_large"]`` (loader option
    ``instanttensor_buffer_size``, pinned staging on), copy and borrowed
    (``instanttensor_copy`` false), the two trees side by side; and the
    series at the geometry rule's bound (``common.geometry_bound``: twice
    the largest tensor that stays on the GPU), copy mode.  A row's first
    word is its tree (its ``time x unbound`` is against that tree's)."""
    rows = [(f"{tree} unbound", tree, {"env": {}}) for tree in BOUND_TREES]

    def bounded(tree: str, bound: int, copy: bool, note: str = "") -> tuple:
        extra = {**PINNED, "instanttensor_buffer_size": bound}
        if not copy:
            extra["instanttensor_copy"] = False
        mode = "copy" if copy else "borrowed"
        return (f"{tree} {size_label(bound)}{note}, {mode}", tree, {"env": {}, "extra": extra})

    for bound in (SIZES["bound"], SIZES["bound_large"]):
        for copy in (True, False):
            rows += [bounded(tree, bound, copy) for tree in BOUND_TREES]
    rows.append(bounded("series", geometry, True, " (geometry rule)"))
    return rows


def bench_bound(run: Run, W: dict, ck: dict, until: float) -> dict:
    """``bound_configs`` on the staging, then the heavy checkpoint (half the
    phase's time each), through ``bench_bounded``: one verified load per row
    (every tensor bitwise), then ``BOUND_PHASE_REPEATS`` interleaved rounds;
    median and best round, each x the same tree unbounded, ring, peak extra
    GPU memory (mem_get_info after every tensor), peak host memory.  Each
    series row is also compared with the pieces row of the same bound and
    mode (``x pieces``: time, median and best)."""
    out: dict = {"trees": {}}
    for tree in BOUND_TREES:
        if tree in W and not W[tree].dead:
            info = W[tree].call("info")
            out["trees"][tree] = {"has_pieces": info.get("has_pieces")}
    if "pieces" not in W:
        run.problem(
            "bound: the bundle has no pieces tree (the series with pieces); its rows are"
            " not run (bash scripts/device/add_tree.sh adds it to .device)"
        )
    elif out["trees"].get("pieces", {}).get("has_pieces") is False:
        run.problem("bound: the bundle's pieces tree does not stream tensors in pieces")
    for i, kind in enumerate(("staging", "heavy")):
        now = time.monotonic()
        share = now + (until - now) / (2 - i)
        info = ck[kind]
        sizes = common.tensor_sizes([str(Path(info["dir"]) / f) for f in info["files"]])
        geometry, largest_on_gpu = common.geometry_bound(sizes.values())
        configs = bound_configs(kind, geometry)
        st = bench_bounded(run, W, ck, kind, share, configs, BOUND_PHASE_REPEATS)
        st["bound_bytes"] = SIZES["bound"]
        st["bounds"] = [SIZES["bound"], SIZES["bound_large"], geometry]
        st["geometry"] = {"bound_bytes": geometry, "largest_on_gpu_bytes": largest_on_gpu}
        st["largest_tensor_bytes"] = max(sizes.values())
        for label, c in st["configs"].items():
            if label.startswith("series ") and "geometry" not in label:
                old = st["configs"].get("pieces " + label.partition(" ")[2], {})
                c["ratio_vs_pieces"] = common.ratio(c["median_s"], old.get("median_s"))
                c["ratio_best_vs_pieces"] = common.ratio(c["min_s"], old.get("min_s"))
            bound = c.get("bound_bytes")
            if bound and c.get("ring_bytes") and c["ring_bytes"] > bound:
                run.problem(
                    f"bound {kind} {label}: ring {c['ring_bytes']} bytes above the bound {bound}"
                )
        out[kind] = st
    return out


def bench_deferred(run: Run, W: dict, ck: dict, controls: list[dict], until: float) -> dict:
    """Layerwise online processing of the layered checkpoint (ring bounded,
    InstantTensor's stream), whole and as rank 0 of 8 (``tp=8``: TP-local
    parameters, loaders that narrow).  Two runs each, the first verified;
    the figures are the larger of the two.  First, the peak memory while one
    layer is loaded and processed (worker op ``processing_peak``), base and
    series."""
    folder = ck["layered"]["dir"]
    bound = {"INSTANTTENSOR_BUFFER_SIZE": str(SIZES["bound"])}
    # COPY=1: the series' default (copies); COPY=0: loader option
    # ``instanttensor_copy`` false (borrowed), never given to the base.
    borrowed = {"env": bound, "extra": COPY_FALSE}
    configs = [
        ("base (always copies)", "base", {"env": bound}),
        ("series COPY=1", "series", {"env": bound}),
        ("series COPY=0", "series", borrowed),
    ]
    for ctl in controls:
        # A control tree before the borrowed-mode patch has no borrowed mode
        # (it rejects the key): its row copies, and its label says so.
        tree = ctl["tree"]
        if tree in W and not W[tree].call("info").get("copy_option"):
            configs.append((f"{tree} (no borrowed mode: copies)", tree, {"env": bound}))
        else:
            configs.append((f"{tree} COPY=0 (no ownership)", tree, borrowed))
    out: dict = {"dir": folder, "tp": TP, "configs": {}}
    configs = runnable(run, configs, out, W)
    # One layer processed (fp8): peak memory, the base release's queue against the series.
    peaks: dict = {"shape": SIZES["layer_shape"]}
    for wname in ("base", "series"):
        results = [W[wname].call("processing_peak", shape=SIZES["layer_shape"]) for _ in range(2)]
        ok = [r for r in results if "error" not in r]
        if len(ok) < len(results) or not all(r["processed"] for r in ok):
            run.problem(f"processing peak on {wname}: {json.dumps(results)[:600]}")
        peaks[wname] = max((r["peak_bytes"] for r in ok), default=None)
    out["processing_peak"] = peaks
    out["cpu_sources_peak"] = bench_cpu_sources(run, W)
    for tp in (1, TP):
        for label, wname, kw in configs:
            if time.monotonic() > until or run.left() < 45:
                run.problem(f"deferred: {label} tp={tp} not run (time budget)")
                continue
            results = [
                W[wname].call("layerwise", dir=folder, tp=tp, verify=i == 0, **kw) for i in range(2)
            ]
            ok = [r for r in results if "error" not in r]
            key = label if tp == 1 else f"{label} tp={tp}"
            if not ok:
                out["configs"][key] = {"error": results[0].get("error", "")[-600:], "tp": tp}
                continue
            s = dict(ok[0])
            for k in ("extra_peak_alloc", "extra_peak_used", "extra_held_alloc"):
                s[k] = max(r[k] for r in ok)
            s["seconds"] = [r["seconds"] for r in ok]
            s["ring_bytes"] = max(
                (rd["buffer_size"] for r in ok for rd in r["readers"]), default=None
            )
            s["copy_args"] = sorted({str(rd["copy"]) for r in ok for rd in r["readers"]})
            s["tree"] = W[wname].tree_label
            out["configs"][key] = s
    return out


def bench_cpu_sources(run: Run, W: dict) -> dict:
    """Peak device memory over a whole layerwise load from CPU sources, with a
    padded layer that completes only in finalize (worker op
    ``cpu_sources_peak``), base and series, twice each: the larger of the two,
    and series / base."""
    out: dict = {"shape": SIZES["layer_shape"]}
    for wname in ("base", "series"):
        results = [W[wname].call("cpu_sources_peak", shape=SIZES["layer_shape"]) for _ in range(2)]
        ok = [r for r in results if "error" not in r]
        if len(ok) < len(results) or not all(r["processed"] for r in ok):
            run.problem(f"cpu sources peak on {wname}: {json.dumps(results)[:600]}")
        out[wname] = max((r["peak_bytes"] for r in ok), default=None)
    out["ratio"] = common.ratio(out["series"], out["base"])
    return out


def bench_real(run: Run, W: dict, ck: dict) -> dict:
    """The transformers-written checkpoint, every tensor compared with what
    safetensors reads: kept to the end (owned tensors must survive the
    reader's close) or compared inline (borrowed ones, before the next)."""
    folder = ck["real"]["dir"]
    bound = {"INSTANTTENSOR_BUFFER_SIZE": str(SIZES["real_bound"])}
    # COPY=1: the series' default (copies); COPY=0: loader option
    # ``instanttensor_copy`` false (borrowed).
    configs = [
        ("base", "base", {"env": {}, "inline": False}),
        ("series COPY=1 (kept)", "series", {"env": {}, "inline": False}),
        ("series COPY=0 (inline)", "series", {"env": {}, "extra": COPY_FALSE, "inline": True}),
        ("series bound (kept)", "series", {"env": bound, "inline": False}),
        (
            "series bound COPY=0 (inline)",
            "series",
            {"env": bound, "extra": COPY_FALSE, "inline": True},
        ),
        (
            "series bound, pinned staging (inline)",
            "series",
            {"env": bound, "extra": PINNED, "inline": True},
        ),
        (
            "series priority + bound + COPY=0 (inline)",
            "series",
            {
                "env": bound,
                "extra": {**COPY_FALSE, "instanttensor_priority_prefixes": PRIORITY},
                "inline": True,
            },
        ),
    ]
    out: dict = {
        "checkpoint": {k: v for k, v in ck["real"].items() if k != "order"},
        "bound_bytes": SIZES["real_bound"],
        "priority_prefixes": PRIORITY,
        "configs": {},
    }
    for label, wname, kw in runnable(run, configs, out):
        r = W[wname].call("real", dir=folder, timeout=120, **kw)
        r["tree"] = W[wname].tree_label
        r["env"], r["extra"] = kw["env"], kw.get("extra")
        r["copy_args"] = sorted({str(rd["copy"]) for rd in r.get("readers", [])})
        out["configs"][label] = r
        if "error" in r or r.get("n_mismatches") or not r.get("names_equal"):
            keys = ("error", "n_mismatches", "mismatches", "missing", "unexpected", "duplicates")
            run.problem(f"real-writer {label}: {json.dumps({k: r.get(k) for k in keys})[:600]}")
    return out


def bench_pinned_read(run: Run, W: dict, ck: dict) -> dict:
    """The staging checkpoint's 1 GiB tensor read into a preallocated GPU
    tensor: pageable (safetensors) against the series' pinned reader over a
    grid of threads x chunk sizes (worker op ``pinned_read``)."""
    info = ck["staging"]
    r = W["series"].call(
        "pinned_read", file=info["big_file"], tensor=info["big_tensor"], reps=3, timeout=150
    )
    r["tree"] = W["series"].tree_label
    if "error" in r:
        run.problem(f"pinned_read: {r['error'][-600:]}")
    for label, m in r.get("methods", {}).items():
        if not m.get("bitwise_equal"):
            run.problem(f"pinned_read {label}: the GPU copy differs from the file")
    return r


DISK_REPEATS = 3
GIB_BOUND = common.GiB


def bench_disk(run: Run, W: dict, ck: dict, until: float) -> dict:
    """The disk checkpoint on the machine's own disk, page cache dropped
    before every load (worker ``drop_page_cache``: ``drop_caches`` as root,
    else ``posix_fadvise``): base InstantTensor, the series unbounded and
    bounded at ``SIZES["bound_large"]`` (256 MiB) and 1 GiB, pinned staging
    on, interleaved; time, InstantTensor's backend and io depth."""
    large = SIZES["bound_large"]
    gib = GIB_BOUND if large >= 64 * common.MiB else 4 * large  # --small: 8 MiB
    bounded = [
        (f"series {size_label(b)}, pinned staging", "series",
         {"extra": {**PINNED, "instanttensor_buffer_size": b}, "drop_cache": True})
        for b in (large, gib)
    ]  # fmt: skip
    configs = [
        ("base unbound", "base", {"drop_cache": True}),
        ("series unbound", "series", {"drop_cache": True}),
        *bounded,
    ]
    st = bench_bounded(run, W, ck, "disk", until, configs, DISK_REPEATS)
    st["disk"] = run.res.get("disk")
    for c in st["configs"].values():
        readers = c.get("readers_seen") or []
        c["io_depth"] = sorted({rd.get("io_depth") for rd in readers} - {None})
        c["backend"] = sorted({rd.get("backend") for rd in readers} - {None})
    return st


DRAFT_FREE = (4 * common.GiB, common.GiB)


def bench_draft(run: Run, W: dict, ck: dict, until: float) -> dict:
    """A draft loaded after its target filled the GPU (worker op ``draft``):
    the draft's parameters first, then the GPU filled so that 4 GiB, then
    1 GiB stays free; the series with options unset and vLLM's safetensors
    loader, each bitwise; time, peak extra device memory (mem_get_info after
    every tensor), InstantTensor's ring; a load that raises is its outcome."""
    folder = ck["draft"]["dir"]
    info = ck["draft"]
    out: dict = {"dir": folder, "checkpoint_gib": info["payload_bytes"] / common.GiB,
                 "largest_tensor_bytes": info["largest_tensor_bytes"], "rows": {}}  # fmt: skip
    small = SIZES["bound"] < 64 * common.MiB
    for free in DRAFT_FREE:
        for label, wname, fmt_ in (
            ("series, options unset", "series", IT),
            ("vLLM safetensors", "base", "safetensors"),
        ):
            leave = free // 1024 if small else free
            r = W[wname].call("draft", dir=folder, format=fmt_, leave_free=leave, timeout=120)
            r["ring_bytes"] = max((rd["buffer_size"] for rd in r.get("readers", [])), default=None)
            r.pop("readers", None)
            out["rows"][f"{label}, {free / common.GiB:g} GiB free"] = r
            if r.get("n_mismatches"):
                run.problem(f"draft {label}, {free / common.GiB:g} GiB free: mismatches")
    for free in DRAFT_FREE:
        mine = out["rows"].get(f"series, options unset, {free / common.GiB:g} GiB free", {})
        ref = out["rows"].get(f"vLLM safetensors, {free / common.GiB:g} GiB free", {})
        mine["ratio_vs_safetensors"] = common.ratio(mine.get("seconds"), ref.get("seconds"))
    return out


def bench_kimi(run: Run, W: dict, ck: dict, until: float) -> dict:
    """A Kimi-K2-class byte mix (only ``embed_tokens`` and ``lm_head``,
    163840 x 7168 bf16 each, above the bound): the series unbounded against
    the series bounded at ``SIZES["bound_large"]`` with pinned staging, copy
    and borrowed, interleaved (``bench_bounded``)."""
    b = SIZES["bound_large"]
    extra = {**PINNED, "instanttensor_buffer_size": b}
    configs = [
        ("series unbound", "series", {}),
        (f"series {size_label(b)}, pinned staging", "series", {"extra": extra}),
        (f"series {size_label(b)}, pinned staging, borrowed", "series",
         {"extra": {**extra, **COPY_FALSE}}),
    ]  # fmt: skip
    st = bench_bounded(run, W, ck, "kimi", until, configs)
    st["bound_bytes"] = b
    return st


MANY_REPEATS = 4
BASE_BOUND = "base release, INSTANTTENSOR_BUFFER_SIZE at the bound"
# The rows ``many`` runs unless ``--many-configs`` names others ("all": every
# row of ``many_configs``): the base and the series in copy and borrowed mode,
# 35 s a round on the H200, so that four rounds fit beside the other phases.
MANY_MODES = (
    "base release",
    "series, options unset",
    "series, instanttensor_copy: false",
    "series bound",
)


def many_configs(ck: dict) -> list:
    """The many-tensor rows: every configuration on the whole checkpoint, then
    the retention check's cost on ``many-part`` (a fifth of the shards), with
    a consumer that keeps a tensor it owns, at stack depth 1 and 60, with
    and without the check."""
    bound = {"INSTANTTENSOR_BUFFER_SIZE": str(SIZES["bound"])}
    keeps = {"extra": COPY_FALSE, "keep_owned": True}
    configs = [
        ("base release", "base", {}),
        ("series, options unset", "series", {}),
        ("series, instanttensor_copy: false", "series", {"extra": COPY_FALSE}),
        ("series, borrowed, consumer keeps an owned tensor", "series", keeps),
        ("series bound", "series", {"env": bound}),
        ("series bound, pinned staging", "series", {"env": bound, "extra": PINNED}),
        # The bound's own cost: InstantTensor's ring at the bound, in the base release.
        (BASE_BOUND, "base", {"env": bound}),
    ]
    part = {"dir": ck["many"]["part"]["dir"], "dests": ck["many"]["dir"]}
    for depth in (1, 60):
        for check in (True, False):
            label = f"check cost: keeps an owned tensor, depth {depth}"
            kw = {**keeps, **part, "depth": depth, "retention_check": check}
            configs.append((label + ("" if check else ", check off"), "series", kw))
    return configs


def bench_many(
    run: Run, W: dict, ck: dict, until: float, repeats: int = MANY_REPEATS, only: str | None = None
) -> dict:
    """Many small tensors through DefaultModelLoader (worker op ``stream``:
    each tensor copied into its preallocated GPU parameter), every
    configuration interleaved with the base round by round; medians of the
    load time, the time to the first tensor and the time per tensor, and
    each row's median and best round against the base's.  ``only``: the
    rows, ';'-separated (default ``MANY_MODES``; "all": every row).  The
    retention check's cost is each ``check cost`` row's time with the check
    over its time without."""
    info = ck["many"]
    out: dict = {
        "dir": info["dir"],
        "n_tensors": info["n_tensors"],
        "n_files": len(info["files"]),
        "tensor_bytes": info["largest_tensor_bytes"],
        "part": info["part"],
        "repeats": repeats,
        "rounds": 0,
        "configs": {},
    }
    rows = MANY_MODES if only is None else None if only == "all" else only.split(";")
    configs = [c for c in many_configs(ck) if rows is None or c[0] in rows]
    configs = runnable(run, configs, out)
    runs: dict[str, list] = {label: [] for label, _, _ in configs}
    for rnd, (label, wname, kw) in interleaved(configs, repeats):
        if label == configs[rnd % len(configs)][0]:
            if phase_over(run, until, "many", out, rnd):
                break
            out["rounds"] = rnd + 1
        r = W[wname].call("stream", timeout=120, **{"dir": info["dir"], **kw})
        if "error" not in r and not r["names_ok"]:
            run.problem(f"many {label}: {r['n']} tensors, not the checkpoint's names")
        runs[label].append(r)
    for label, wname, kw in configs:
        part = kw.get("dir") == info["part"]["dir"]
        n = info["part"]["n_tensors"] if part else info["n_tensors"]
        nbytes = info["part"]["payload_bytes"] if part else info["payload_bytes"]
        s = report.summarise_loads(runs[label], nbytes)
        ok = [r for r in runs[label] if "error" not in r]
        s["tree"] = W[wname].tree_label
        s["n_tensors"] = n
        s["first_tensor_s"] = common.median([r["first_tensor_s"] for r in ok])
        s["us_per_tensor"] = s["median_s"] * 1e6 / n if s["median_s"] else None
        out["configs"][label] = s
    # Where the time to the first tensor goes, base against the series.
    out["profile_first"] = {
        label: W[wname].call("profile_first", timeout=60, **{"dir": info["dir"], **kw})
        for label, wname, kw in configs
        if label in ("base release", "series, options unset", "series bound")
    }
    for label, s in out["configs"].items():
        if not label.startswith("check cost"):
            # A bounded load against the base release with its ring at the same bound.
            bounded = label.startswith("series bound") and BASE_BOUND in out["configs"]
            s["base"] = BASE_BOUND if bounded else "base release"
            base = out["configs"].get(s["base"], {})
            s["ratio_vs_base"] = common.ratio(s["median_s"], base.get("median_s"))
            # Interference only adds time: the best rounds compare the cost.
            s["ratio_best"] = common.ratio(s["min_s"], base.get("min_s"))
        elif not label.endswith("check off"):
            off = out["configs"].get(f"{label}, check off", {})
            s["check_ratio"] = common.ratio(s["median_s"], off.get("median_s"))
    return out


def bench_tuning(run: Run, W: dict, ck: dict, pinned_gib_s: float | None) -> dict:
    """InstantTensor's own knobs (environment variables it reads itself) on the
    series with COPY=0: chunk size, worker threads, I/O depth, and the other
    backends it accepts for in-memory files.  The smoke run on the H200 found
    the defaults (MMAP, 2 MiB chunks, 12 threads) best among larger chunks
    and more or fewer threads, so this grid looks around them."""
    folder = ck["synthetic"]["dir"]
    mib = common.MiB
    variants = [
        ("defaults", {}),
        ("chunk=512KiB", {"INSTANTTENSOR_CHUNK_SIZE": mib // 2}),
        ("chunk=1MiB", {"INSTANTTENSOR_CHUNK_SIZE": mib}),
        ("chunk=4MiB", {"INSTANTTENSOR_CHUNK_SIZE": 4 * mib}),
        ("concurrency=10", {"INSTANTTENSOR_CONCURRENCY": 10}),
        ("concurrency=14", {"INSTANTTENSOR_CONCURRENCY": 14}),
        (
            "concurrency=14, chunk=1MiB",
            {"INSTANTTENSOR_CONCURRENCY": 14, "INSTANTTENSOR_CHUNK_SIZE": mib},
        ),
        ("io_depth=24", {"INSTANTTENSOR_IO_DEPTH": 24}),
        ("io_depth=64", {"INSTANTTENSOR_IO_DEPTH": 64}),
        ("backend=URING_BUFFERED", {"INSTANTTENSOR_BACKEND": "URING_BUFFERED"}),
        ("backend=AIO_BUFFERED", {"INSTANTTENSOR_BACKEND": "AIO_BUFFERED"}),
    ]
    grid = [(label, {k: str(v) for k, v in env.items()}) for label, env in variants]
    # Borrowed (COPY=0): loader option ``instanttensor_copy`` false, which
    # only the series accepts (a smoke run's "series" is the base tree).
    extra = COPY_FALSE if run.series_mode else {}
    runs: dict[str, list] = {label: [] for label, _ in grid}
    for rnd, (label, env) in interleaved(grid, 3):
        if run.left() < 40:
            run.problem(f"tuning: stopped in round {rnd} (time budget)")
            break
        runs[label].append(W["series"].call("load", dir=folder, env=env, extra=extra, timeout=60))
    out: dict = {"grid": []}
    for label, env in grid:
        s = report.summarise_loads(runs[label])
        readers = [rd for r in runs[label] if "error" not in r for rd in r.get("readers", [])]
        out["grid"].append(
            {
                "label": label,
                "env": env,
                "extra": extra,
                "gib_s": s["gib_s"],
                "runs": s["runs"],
                "errors": s["errors"],
                "ratio_vs_pinned": common.ratio(s["gib_s"], pinned_gib_s),
                "resolved": readers[0] if readers else None,
            }
        )
    rated = [g for g in out["grid"] if g["gib_s"]]
    if rated:
        out["best"] = max(rated, key=lambda g: g["gib_s"])
    return out


# --- main ----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"phases (--skip, --only): {', '.join(['tests', *PHASE_SECONDS])}",
    )
    parser.add_argument("--bundle", default=".device")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/qual-out"))
    parser.add_argument("--work", default="/tmp/qual")
    parser.add_argument("--budget", type=float, default=540)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--many-rounds",
        type=int,
        default=MANY_REPEATS,
        help="rounds of the many-tensor benchmark (its share grows to 55 s a round)",
    )
    parser.add_argument(
        "--many-configs",
        help="';'-separated labels of the many-tensor rows to run, or 'all' (default: the"
        " base, the series in copy and borrowed mode)",
    )
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: tooling tests only"
    )
    parser.add_argument("--small", action="store_true", help="tiny checkpoints (tests)")
    parser.add_argument(
        "--skip",
        default="tuning,bound",
        help="comma-separated phases to skip (default: tuning, InstantTensor's own knobs,"
        " and bound, which needs the bundle's pieces tree)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated phases to run, all others skipped, e.g. '--only many' (the"
        " many-tensor benchmark alone: no tests, only its checkpoint written)",
    )
    parser.add_argument(
        "--extra-path",
        action="append",
        default=[],
        help="prepended to PYTHONPATH (tooling tests only)",
    )
    args = parser.parse_args()
    EXTRA_PATH[:] = args.extra_path
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    skip = set(filter(None, args.skip.split(",")))
    if args.only:
        only = set(args.only.split(","))
        if only - {"tests", *PHASE_SECONDS}:
            parser.error(f"--only: no phase {', '.join(sorted(only - {'tests', *PHASE_SECONDS}))}")
        skip = {"tests", *PHASE_SECONDS} - only
    if args.small:
        SIZES.update(SMALL_SIZES)
    run = Run(out, work, args.budget)
    res = run.res
    res["skipped_phases"] = sorted(skip)
    res["device"] = args.device
    bundle_dir = Path(args.bundle).resolve()
    bundle = json.loads((bundle_dir / "bundle.json").read_text())
    series_mode = "series" in bundle["trees"]
    run.series_mode = series_mode
    res["mode"] = "series" if series_mode else "base-only smoke"
    res["bundle"] = {
        k: bundle.get(k)
        for k in (
            "series",
            "base",
            "patches",
            "mode",
            "series_tests",
            "tests_not_run",
            "negative_controls",
            "negative_controls_missing",
        )
    }
    res["bundle"]["wheels"] = [w["file"] for w in bundle["wheels"]]
    res["bundle"]["trees"] = {
        name: {k: v for k, v in tree.items() if k in ("patches", "commit", "overlay_of")}
        for name, tree in bundle["trees"].items()
    }
    run.log(f"qualification run, mode {res['mode']}, budget {args.budget:.0f} s")
    workers: dict[str, Worker] = {}
    gen = None
    try:
        if args.small:  # tests: a folder of this run's own (/dev/shm may be shared)
            shm = work / "checkpoints"
            shm.mkdir()
        else:
            shm = choose_shm(run, SHM_GIB)
        facts = machine_facts(run, shm)
        res["machine"] = facts

        # Wheels and trees.
        site = work / "site"
        wheels = sorted(str(p) for p in (bundle_dir / "wheels").glob("*.whl"))
        site.mkdir()
        if wheels:
            info = run.step(
                "install wheels",
                common.install_wheels_command(PY, wheels, site),
                180,
                out / "run.log",
            )
            if info["rc"] != 0:
                run.problem("wheel install failed (see run.log)")
        else:
            run.log("the bundle has no wheels: nothing to install")
        # The trees this run needs: the base and the series; the negative
        # controls' for the tests and the deferred rows; the pieces tree (the
        # series with pieces, optional) for the bound phase alone.
        controls = bundle.get("negative_controls", []) if series_mode else []
        control_trees = {ctl["tree"] for ctl in controls}
        wanted = {"base", "series"}
        if not {"tests", "deferred"} <= skip:
            wanted |= control_trees
        if "bound" not in skip:
            wanted.add("pieces")
        trees: dict[str, Path] = {}
        t0 = time.monotonic()
        for name in bundle["trees"]:
            if name in wanted:
                trees[name] = common.unpack_tree(bundle_dir, bundle, name, work / "trees" / name)
        res["phases"]["unpack trees"] = {
            "seconds": round(time.monotonic() - t0, 1),
            "trees": sorted(trees),
        }
        run.log(f"unpacked trees {sorted(trees)} in {time.monotonic() - t0:.1f}s")
        series_tree = trees.get("series", trees["base"])

        # Background: checkpoints (CPU) and workers (vLLM import).
        needed = {k for phase in PHASE_SECONDS if phase not in skip for k in CHECKPOINTS[phase]}
        gen_cmd = [PY, str(HERE / "make_checkpoints.py"), str(shm)]
        gen_cmd += ["--only", ",".join(k for k in KINDS if k in needed)]
        if args.small:
            gen_cmd.append("--small")
        disk = work / "disk-root" if args.small or "disk" not in needed else choose_disk(run, work)
        if "disk" in needed:
            shutil.rmtree(disk, ignore_errors=True)
            gen_cmd += ["--disk-root", str(disk)]
        shares = {k: v for k, v in PHASE_SECONDS.items() if k not in skip}
        run.log(
            f"time budget {args.budget:.0f} s; phase shares (s): {json.dumps(shares)},"
            f" {sum(shares.values())} in all, after the tests (~125 s) and setup (~40 s)"
        )
        gen_log = (work / "checkpoints.log").open("w")
        gen_t0 = time.monotonic()
        gen = subprocess.Popen(
            gen_cmd, stdout=gen_log, stderr=subprocess.STDOUT, start_new_session=True
        )
        # One worker per tree a benchmark uses: the pieces tree's only for
        # the bound phase, the controls' only for the deferred rows.
        for name, tree in trees.items():
            if name in control_trees and "deferred" in skip:
                continue
            if name == "pieces" and "bound" in skip:
                continue
            workers[name] = Worker(run, name, tree, site, args.device)
        W = dict(workers)
        if not series_mode and "base" in W:
            W["series"] = W["base"]  # smoke: the series rows run on the base tree
            W["base"].tree_label = "base"
            res["stand_in"] = "series configurations ran on the base tree (no patches yet)"

        # Tests on the GPU.
        tests: dict = {}
        if "tests" not in skip:
            if series_mode:
                # Real vLLM model classes, built on CPU in a spawned process:
                # CPU contracts, run by make test; too slow for this budget.
                files = [f for f in bundle["series_tests"] if Path(f).name not in CPU_ONLY]
                res["tests_cpu_only"] = sorted(set(bundle["series_tests"]) - set(files))
                tests["series"] = run_pytest(
                    run, "series tests", series_tree, site, files, 330, facts
                )
                ran = sorted({f.partition("::")[0] for f in files})
                for p in report.series_test_problems(tests["series"], ran):
                    run.problem(p)
                controls_out = []
                for ctl in controls:
                    parsed = run_pytest(
                        run,
                        f"negative control {ctl['tree']}",
                        trees[ctl["tree"]],
                        site,
                        [ctl["test"]],
                        120,
                        facts,
                    )
                    parsed.update(ctl)
                    parsed["verdict"] = report.negative_control_verdict(parsed)
                    if parsed["verdict"] != "fails as expected":
                        run.problem(
                            f"negative control {ctl['test']} on {ctl['tree']}: {parsed['verdict']}"
                        )
                    controls_out.append(parsed)
                tests["negative_controls"] = controls_out
            else:
                smoke = str(HERE / "smoke_test_cuda.py")
                tests["smoke (base tree)"] = run_pytest(
                    run, "smoke tests", trees["base"], site, [smoke], 180, facts
                )
                for p in report.series_test_problems(tests["smoke (base tree)"], []):
                    run.problem(p.replace("series tests", "smoke tests"))
        res["tests"] = tests

        # Checkpoints must be complete before benchmarks.
        try:
            rc = gen.wait(timeout=run.limit(200, reserve=120))
        except subprocess.TimeoutExpired:
            kill_group(gen)
            rc = "timeout"
        res["phases"]["checkpoints"] = {"rc": rc, "seconds": round(time.monotonic() - gen_t0, 1)}
        run.log(f"checkpoints: rc={rc}, {time.monotonic() - gen_t0:.1f}s since start")
        ck: dict = {}
        for kind in KINDS:
            path = (disk if kind == "disk" else shm) / kind / "checkpoint.json"
            if path.exists():
                ck[kind] = json.loads(path.read_text())
        res["checkpoints"] = {
            k: {kk: vv for kk, vv in v.items() if kk not in ("modules", "order")}
            for k, v in ck.items()
        }
        if rc != 0:
            run.problem(f"checkpoint writer rc={rc} (see bench.log)")

        # Benchmarks.
        if workers:
            for w in workers.values():
                ready = w.wait_ready(run.limit(120, reserve=60))
                res["phases"][f"worker {w.name} import"] = {
                    "seconds": round(ready.get("import_seconds", 0), 1),
                    "ok": bool(ready.get("ready")),
                }
            if not W["base"].dead:
                info = W["base"].call("info")
                res["machine"].update({k: v for k, v in info.items() if k != "op_seconds"})
                res["machine"]["gpu"] = info.get("gpu") or facts.get("gpu_smi")
                res["machine"]["cuda"] = info.get("cuda")
                for name, w in workers.items():
                    if name != "base" and not w.dead:
                        res["machine"][f"vllm_file_{name}"] = w.call("info").get("vllm_file")
            phases = [
                ("real_writer", "real", lambda until: bench_real(run, W, ck)),
                (
                    "throughput",
                    "synthetic",
                    lambda until: bench_throughput(run, W, ck, args.repeats, until),
                ),
                ("staging", "staging", lambda until: bench_bounded(run, W, ck, "staging", until)),
                ("heavy", "heavy", lambda until: bench_bounded(run, W, ck, "heavy", until)),
                ("deferred", "layered", lambda until: bench_deferred(run, W, ck, controls, until)),
                ("pinned_read", "staging", lambda until: bench_pinned_read(run, W, ck)),
                ("bound", "heavy", lambda until: bench_bound(run, W, ck, until)),
                ("disk", "disk", lambda until: bench_disk(run, W, ck, until)),
                ("draft", "draft", lambda until: bench_draft(run, W, ck, until)),
                ("kimi", "kimi", lambda until: bench_kimi(run, W, ck, until)),
                (
                    "many",
                    "many",
                    lambda until: bench_many(
                        run, W, ck, until, args.many_rounds, args.many_configs
                    ),
                ),
                (
                    "tuning",
                    "synthetic",
                    lambda until: bench_tuning(
                        run, W, ck, res.get("throughput", {}).get("pinned_gib_s")
                    ),
                ),
            ]
            for key, needs, fn in phases:
                if key in skip:
                    continue
                if needs not in ck:
                    run.problem(f"{key}: no {needs} checkpoint")
                    continue
                if run.left() < 40:
                    run.problem(f"{key}: skipped, time budget spent")
                    continue
                t0 = time.monotonic()
                run.log(f"benchmark {key} ...")
                try:
                    share = PHASE_SECONDS[key] * (SMALL_SCALE if args.small else 1)
                    if key == "many":
                        share = max(share, 55 * args.many_rounds)
                    res[key] = fn(t0 + share)
                except Exception as e:  # keep going: evidence first
                    import traceback

                    run.problem(f"{key}: {type(e).__name__}: {e}")
                    run.log(traceback.format_exc(), echo=False)
                res["phases"][f"bench {key}"] = {"seconds": round(time.monotonic() - t0, 1)}
                run.log(f"benchmark {key}: {time.monotonic() - t0:.1f}s")
        check_semantics(run, res, series_mode)
    except Exception as e:
        import traceback

        run.problem(f"run aborted: {type(e).__name__}: {e}")
        run.log(traceback.format_exc(), echo=False)
    finally:
        for w in workers.values():
            w.stop()
        if gen is not None and gen.poll() is None:
            kill_group(gen)
        finish(run, res, series_mode, args)
    return 0 if res.get("status") in ("pass", "smoke-ok") else 1


def check_semantics(run: Run, res: dict, series_mode: bool) -> None:
    """The configurations did what their labels say (only meaningful on the
    series; where a tensor lives, only on the GPU, where the CPU fallback is
    told apart from InstantTensor's stream by its device)."""
    if not series_mode:
        return
    tp = res.get("throughput", {}).get("configs", {})
    for label in ("series COPY=1", "series COPY=0", "series COPY=0, retention check off"):
        want = ["False"] if "COPY=0" in label else ["True"]
        if tp.get(label, {}).get("copy_args") not in (None, [], want):
            run.problem(f"{label} called InstantTensor with copy={tp[label]['copy_args']}")
    off = tp.get("series COPY=0, retention check off", {})
    if off.get("runs") and not off["retention_check_off"]:
        run.problem("series COPY=0, retention check off: the check was not switched off")
    if tp.get("base InstantTensor", {}).get("copy_args") not in (None, [], ["True"]):
        run.problem("base called InstantTensor with copy != True")
    # Deferred and real-writer rows: "COPY=0" in a label is borrowed, else copies.
    for phase, name in (("deferred", "deferred"), ("real_writer", "real-writer")):
        for label, c in res.get(phase, {}).get("configs", {}).items():
            want = ["False"] if "COPY=0" in label else ["True"]
            if "error" not in c and c.get("copy_args") not in (None, [], want):
                run.problem(f"{name} {label} called InstantTensor with copy={c['copy_args']}")
    for label, c in res.get("many", {}).get("configs", {}).items():
        borrowed = "false" in label or "keeps" in label
        if c.get("copy_args") not in ([], [str(not borrowed)]):
            run.problem(f"many {label} called InstantTensor with copy={c['copy_args']}")
        if c.get("runs") and c["retention_check_off"] != label.endswith("check off"):
            run.problem(f"many {label}: the retention check was not as the label says")
    on_gpu = res.get("device", "cuda") == "cuda"
    for label, c in res.get("real_writer", {}).get("configs", {}).items():
        if "error" in c:
            continue
        n, cpu = c.get("n_tensors"), c.get("on_cpu", 0)
        if on_gpu and "bound" in label and not cpu:
            run.problem(f"real-writer {label}: no tensor fell back to CPU")
        if on_gpu and "COPY=0" in label and c["borrowed_marked"] - c["cpu_borrowed"] != n - cpu:
            run.problem(
                f"real-writer {label}: {c['borrowed_marked'] - c['cpu_borrowed']} of "
                f"{n - cpu} tensors on the GPU marked borrowed"
            )
        if (
            on_gpu
            and "pinned staging" in label
            and not (cpu and c["cpu_borrowed"] == 0 and c["cpu_pinned"] == cpu)
        ):
            run.problem(
                f"real-writer {label}: of {cpu} tensors on CPU, {c['cpu_pinned']} pinned"
                f" (all must be) and {c['cpu_borrowed']} marked borrowed (none may be:"
                " each owns its pinned memory)"
            )
        if "priority" in label and not (c.get("priority_first") and c.get("n_priority")):
            run.problem(
                f"real-writer {label}: priority tensors ({c.get('n_priority')}) not yielded first"
            )
    for kind in ("staging", "heavy"):
        c = res.get(kind, {}).get("configs", {}).get("series bound, pinned staging", {})
        if c and on_gpu and not c.get("cpu_n"):
            run.problem(f"{kind} series bound, pinned staging: no tensor fell back to CPU")
    for kind in ("staging", "heavy"):
        for label, c in res.get("bound", {}).get(kind, {}).get("configs", {}).items():
            if on_gpu and c.get("bound_bytes") and c.get("runs") and not c.get("cpu_n"):
                run.problem(f"bound {kind} {label}: no tensor fell back to CPU")
            borrowed = "borrowed" in label and label.startswith("series")
            if borrowed and c.get("runs") and c.get("copy_args") not in ([], ["False"]):
                run.problem(f"bound {kind} {label}: InstantTensor copy={c['copy_args']}")
    pr = res.get("pinned_read", {})
    for label, m in pr.get("methods", {}).items():
        if on_gpu and "pinned reader" in label and not m.get("is_pinned"):
            run.problem(f"pinned_read {label}: the reader's tensor is not pinned memory")
        if m.get("reader_threads") not in (None, m.get("threads")):
            run.problem(f"pinned_read {label}: the reader has {m['reader_threads']} threads")


def finish(run: Run, res: dict, series_mode: bool, args) -> None:
    """Verdicts, then the evidence: qualification.json first, so that a
    failure of the summary or the plot cannot lose the figures."""
    out = run.out
    res["wall_seconds"] = round(run.elapsed(), 1)
    try:
        res["targets"] = report.evaluate_targets(res)
    except Exception as e:
        res["targets"] = []
        run.problem(f"targets not evaluated: {type(e).__name__}: {e}")
    if series_mode:
        missed = [
            t["name"] for t in res["targets"] if not t["met"] and "ambitious" not in t["name"]
        ]
        res["targets_missed"] = missed
        res["status"] = "pass" if not res["problems"] else "fail"
    else:
        res["status"] = "smoke-ok" if not res["problems"] else "smoke-problems"
    # Logs: the checkpoint writer and each worker, in one file.
    with (out / "bench.log").open("w") as f:
        for path in sorted(run.work.glob("*.log")):
            f.write(f"\n===== {path.name}\n")
            f.write(path.read_text(errors="replace")[-3_000_000:])
    common.write_json(out / "qualification.json", res)
    try:
        (out / "summary.md").write_text(report.render_summary(res))
    except Exception as e:
        res["problems"].append(f"summary.md not written: {type(e).__name__}: {e}")
    try:
        err = report.plot(res, out / "qualification.png")
    except Exception as e:
        err = f"no plot: {type(e).__name__}: {e}"
    if err:
        res["problems"].append(err)
    common.write_json(out / "qualification.json", res)
    run.log(
        f"status {res['status']}; {len(res['problems'])} problems; wall {res['wall_seconds']} s"
    )
    try:
        print_table(res)
    except Exception as e:  # the status line must come out whatever the figures are
        print(f"summary table failed: {type(e).__name__}: {e}")
        print(f"STATUS {res.get('status')} wall {res.get('wall_seconds')} s")
    if not args.small:
        shutil.rmtree("/dev/shm/qual", ignore_errors=True)
        if res.get("disk"):
            shutil.rmtree(res["disk"]["folder"], ignore_errors=True)


def print_table(res: dict) -> None:
    """The short table at the end of the output."""
    fmt, mib = report.fmt, report.mib
    print("\n==== summary ====")
    for name, run in res.get("tests", {}).items():
        if name == "negative_controls":
            for ctl in run:
                print(f"control {ctl['tree']}: {ctl.get('totals')} -> {ctl.get('verdict')}")
            continue
        print(f"tests {name}: {run.get('totals')}")
    tp = res.get("throughput", {})
    for label, c in tp.get("configs", {}).items():
        print(
            f"tp {label:<36} {fmt(c.get('gib_s'))} GiB/s  x base "
            f"{fmt(c.get('ratio_vs_base'))}  x pinned {fmt(c.get('ratio_vs_pinned'))}"
            f"  median {fmt(c.get('median_s'), 3)} s best {fmt(c.get('min_s'), 3)} s"
            f" (x base {fmt(c.get('time_ratio_best'), 3)}) n={c.get('runs')}"
        )
    if tp:
        print(
            f"tp pinned H2D {fmt(tp.get('pinned_gib_s'))} GiB/s, pageable "
            f"{fmt(tp.get('pageable_gib_s'))} GiB/s; rounds {tp.get('rounds')}/"
            f"{tp.get('repeats')}; retention check: COPY=0 with / without "
            f"{fmt(tp.get('retention_check_ratio'), 3)}"
        )
    for kind in ("staging", "heavy"):
        for label, c in res.get(kind, {}).get("configs", {}).items():
            print(
                f"{kind} {label:<29} {fmt(c.get('gib_s'))} GiB/s x unbound "
                f"{fmt(c.get('ratio_vs_unbound'))} ring {mib(c.get('ring_bytes'))} MiB peak "
                f"{mib(c.get('peak_used_delta'))} MiB cpu {mib(c.get('cpu_bytes'))} MiB @ "
                f"{fmt(c.get('cpu_gb_s'))} GB/s"
            )
    for kind in ("staging", "heavy"):
        for label, c in res.get("bound", {}).get(kind, {}).get("configs", {}).items():
            print(
                f"bound {kind} {label:<38} {fmt(c.get('median_s'), 3)} s best"
                f" {fmt(c.get('min_s'), 3)} x unbound {fmt(c.get('ratio_vs_unbound'))}"
                f" ({fmt(c.get('ratio_best_vs_unbound'))}) x pieces"
                f" {fmt(c.get('ratio_vs_pieces'))} ring {mib(c.get('ring_bytes'))} MiB peak"
                f" {mib(c.get('peak_used_delta'))} MiB mismatches"
                f" {(c.get('verify') or {}).get('n_mismatches')}"
            )
    peaks = res.get("deferred", {}).get("processing_peak", {})
    if peaks:
        print(
            f"processing one layer {peaks.get('shape')}: peak base {mib(peaks.get('base'))} MiB,"
            f" series {mib(peaks.get('series'))} MiB"
        )
    cpu = res.get("deferred", {}).get("cpu_sources_peak", {})
    if cpu:
        print(
            f"layerwise load from CPU sources: peak base {mib(cpu.get('base'))} MiB, series "
            f"{mib(cpu.get('series'))} MiB, series / base {fmt(cpu.get('ratio'), 3)}"
        )
    for label, c in res.get("deferred", {}).get("configs", {}).items():
        bound = c.get("tp_local_bound_bytes")
        print(
            f"deferred {label:<36} extra {mib(c.get('extra_peak_alloc'))} MiB held "
            f"{mib(c.get('extra_held_alloc'))} (+ring {mib(c.get('extra_peak_used'))}) bound "
            f"{mib(bound)} mismatched {c.get('n_mismatched_modules')}"
            + (f" ERROR {c['error'][-120:]}" if "error" in c else "")
        )
    for label, c in res.get("real_writer", {}).get("configs", {}).items():
        print(
            f"real {label:<42} n={c.get('n_tensors')} names_equal={c.get('names_equal')} "
            f"mismatches={c.get('n_mismatches')} cpu={c.get('on_cpu')} "
            f"borrowed={c.get('borrowed_marked')} pinned={c.get('cpu_pinned')}"
        )
    many = res.get("many", {})
    for label, c in many.get("configs", {}).items():
        print(
            f"many {label:<50} {fmt(c.get('median_s'))} s (best {fmt(c.get('min_s'))}) x base"
            f" {fmt(c.get('ratio_vs_base'), 3)} (best {fmt(c.get('ratio_best'), 3)})"
            f" first {fmt(c.get('first_tensor_s'))} s {fmt(c.get('us_per_tensor'), 1)} us/tensor"
            + (f" check on/off {fmt(c['check_ratio'], 3)}" if "check_ratio" in c else "")
        )
    pr = res.get("pinned_read", {})
    for label, m in pr.get("methods", {}).items():
        print(
            f"pinned_read {label:<40} {fmt(m.get('gb_s'))} GB/s (read "
            f"{fmt(m.get('read_median_s'), 3)} s) pinned={fmt(m.get('is_pinned'))}"
            f" equal={fmt(m.get('bitwise_equal'))}"
        )
    if pr.get("best"):
        print(
            f"pinned_read best {pr['best']} default {pr.get('default')} "
            f"alloc {[round(a, 3) for a in pr.get('alloc_s', [])]} s"
        )
    best = res.get("tuning", {}).get("best")
    if best:
        print(
            f"tuning best: {best['label']} {fmt(best['gib_s'])} GiB/s "
            f"x pinned {fmt(best.get('ratio_vs_pinned'))}"
        )
    for t in res.get("targets", []):
        print(
            f"target {t['name']}: {fmt(t['value'])} ({t['target']}) "
            f"{'MET' if t['met'] else 'missed'}"
        )
    for p in res.get("problems", []):
        print(f"PROBLEM {p[:400]}")
    print(f"phases: {json.dumps(res.get('phases'))[:1500]}")
    print(f"STATUS {res.get('status')} wall {res.get('wall_seconds')} s")


if __name__ == "__main__":
    sys.exit(main())
