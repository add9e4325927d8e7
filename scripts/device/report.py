"""Turn a run's results into verdicts, a markdown summary and a plot.

Standard library only (matplotlib is imported by ``plot`` alone), so the
tooling tests exercise it on a CPU machine with made-up results.
"""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import common

# --- pytest results ------------------------------------------------------------


def parse_junit(path: Path) -> dict:
    """Counts per test file and the outcome of every test, from pytest's
    ``--junitxml`` (junit_family=xunit1, which records each test's file)."""
    result: dict = {"files": {}, "tests": [], "totals": {}}
    if not path.exists():
        result["error"] = f"{path.name} was not written (pytest crashed or timed out)"
        return result
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        file = case.get("file") or (case.get("classname") or "").replace(".", "/") + ".py"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "")[:300]
                break
        name = case.get("name")
        result["tests"].append({"file": file, "name": name, "outcome": outcome, "message": message})
        counts = result["files"].setdefault(
            file, {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        )
        counts[outcome] += 1
    totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for counts in result["files"].values():
        for key in totals:
            totals[key] += counts[key]
    result["totals"] = totals
    return result


def series_test_problems(tests: dict, expected_files: list[str]) -> list[str]:
    """Everything that makes the series' GPU test run unacceptable: a failure,
    an error, any skip (the CUDA tests must run there), a file with no test."""
    problems = []
    if "error" in tests:
        problems.append(f"series tests: {tests['error']}")
        return problems
    totals = tests.get("totals", {})
    if totals.get("failed") or totals.get("error"):
        bad = [
            f"{t['file']}::{t['name']}"
            for t in tests["tests"]
            if t["outcome"] in ("failed", "error")
        ]
        problems.append(f"series tests: {len(bad)} failed or errored: " + ", ".join(bad[:8]))
    skipped = [t for t in tests.get("tests", []) if t["outcome"] == "skipped"]
    if skipped:
        problems.append(
            f"series tests: {len(skipped)} skipped on the GPU machine (none may be): "
            + "; ".join(f"{t['name']} ({t['message']})" for t in skipped[:5])
        )
    for file in expected_files:
        if not tests.get("files", {}).get(file):
            problems.append(f"series tests: no test of {file} ran")
    return problems


def negative_control_verdict(tests: dict) -> str:
    """``fails as expected`` when at least one test failed; ``inconclusive``
    when only errors (e.g. the file cannot be imported without the patch);
    ``UNEXPECTED PASS`` when everything passed."""
    totals = tests.get("totals", {})
    if "error" in tests:
        return f"inconclusive: {tests['error']}"
    if totals.get("failed"):
        return "fails as expected"
    if totals.get("error"):
        return "inconclusive: errors only (import or fixture), no assertion failed"
    return "UNEXPECTED PASS"


# --- figures ---------------------------------------------------------------------


def summarise_loads(runs: list[dict], nbytes: int | None = None) -> dict:
    """Median time, throughput and memory over the timed runs of one config."""
    ok = [r for r in runs if "error" not in r]
    secs = [r["seconds"] for r in ok]
    nbytes = nbytes or (ok[0]["bytes"] if ok else 0)
    med = common.median(secs)
    cpu_rates = [
        r["cpu_bytes"] / r["cpu_seconds"] for r in ok if r.get("cpu_bytes") and r.get("cpu_seconds")
    ]
    rings = [rd["buffer_size"] for r in ok for rd in r.get("readers", [])]
    return {
        "runs": len(ok),
        "errors": [r["error"][-600:] for r in runs if "error" in r][:2],
        "seconds": secs,
        "median_s": med,
        "min_s": min(secs) if secs else None,
        "max_s": max(secs) if secs else None,
        "bytes": nbytes,
        "gib_s": common.gib_per_s(nbytes, med),
        "gb_s": nbytes / 1e9 / med if med else None,
        "ring_bytes": max(rings) if rings else None,
        "copy_args": sorted({str(rd["copy"]) for r in ok for rd in r.get("readers", [])}),
        "peak_used_delta": common.median([r.get("peak_used_delta") for r in ok]),
        "torch_peak_delta": common.median([r.get("torch_peak_delta") for r in ok]),
        "cpu_bytes": ok[0].get("cpu_bytes") if ok else None,
        "cpu_n": ok[0].get("cpu_n") if ok else None,
        "cpu_gb_s": common.median(cpu_rates) / 1e9 if cpu_rates else None,
        "retention_check_off": any(r.get("retention_check_off") for r in ok),
    }


# Allowed above a memory bound: allocator rounding, not a tensor.
ALLOC_SLACK = common.MiB
# Peak GPU memory with pinned staging may exceed the pageable fallback's by
# this much (mem_get_info's granularity and InstantTensor's own allocations).
PEAK_SLACK = 16 * common.MiB


def evaluate_targets(res: dict) -> list[dict]:
    """The series' targets, each with the measured value and whether it holds."""
    targets = []

    def add(name, target, value, met, note=""):
        targets.append({"name": name, "target": target, "value": value, "met": met, "note": note})

    def mib_of(n):
        return None if n is None else n / common.MiB

    # A phase skipped by choice (--skip, --only) has no targets; one that failed misses them.
    skipped = set(res.get("skipped_phases", []))
    if "throughput" not in skipped:
        tput = res.get("throughput", {})
        tp = tput.get("configs", {})
        base = tp.get("base InstantTensor", {}).get("gib_s")
        aa = common.ratio(tp.get("base InstantTensor (A/A repeat)", {}).get("gib_s"), base)
        noise = f"A/A repeat of the base: {aa:.3f}" if aa else ""
        for label in ("series COPY=1", "series COPY=0"):
            r = common.ratio(tp.get(label, {}).get("gib_s"), base)
            add(f"throughput {label} / base", ">= 0.97", r, r is not None and r >= 0.97, noise)
        r = tput.get("retention_check_ratio")
        add(
            "retention check: COPY=0 throughput with / without it",
            "stated",
            r,
            r is not None,
            (f"the check costs {100 * (1 - r):.1f} % of borrowed-mode throughput; " if r else "")
            + noise,
        )
        tuning = res.get("tuning", {})
        if tuning.get("grid"):
            best = tuning.get("best", {})
            rates = [best.get("gib_s"), *(tp.get(k, {}).get("gib_s") for k in tp if "series" in k)]
            r = common.ratio(max([v for v in rates if v], default=None), tput.get("pinned_gib_s"))
            add(
                "series best / pinned H2D ceiling (ambitious)",
                ">= 0.80",
                r,
                r is not None and r >= 0.80,
                best.get("label", ""),
            )

    if not {"staging", "heavy"} <= skipped:
        st = res.get("staging", {}).get("configs", {})
        hv = res.get("heavy", {}).get("configs", {})
        pinned, pageable = "series bound, pinned staging", "series bound"
        rate = st.get(pinned, {}).get("cpu_gb_s")
        add(
            "CPU fallback with pinned staging, to the end of the GPU copy (GB/s)",
            ">= 20",
            rate,
            rate is not None and rate >= 20,
            f"pageable fallback {fmt(st.get(pageable, {}).get('cpu_gb_s'))} GB/s; heavy checkpoint"
            f" {fmt(hv.get(pinned, {}).get('cpu_gb_s'))} GB/s",
        )
        r = st.get(pinned, {}).get("ratio_vs_unbound")
        add(
            "bounded load (64 MiB, one 1 GiB tensor) with pinned staging / unbounded",
            "<= 1.2",
            r,
            r is not None and r <= 1.2,
            f"pageable fallback {fmt(st.get(pageable, {}).get('ratio_vs_unbound'))}",
        )
        fraction = res.get("heavy", {}).get("oversized_fraction")
        r = hv.get(pinned, {}).get("ratio_vs_unbound")
        add(
            f"heavy checkpoint ({fmt(100 * fraction, 0) if fraction else '?'} % oversized)"
            " bounded with pinned staging / unbounded",
            "<= 1.35",
            r,
            r is not None and r <= 1.35,
            f"pageable fallback {fmt(hv.get(pageable, {}).get('ratio_vs_unbound'))}",
        )
        bound = res.get("staging", {}).get("bound_bytes") or 64 * common.MiB
        rings = [c.get(pinned, {}).get("ring_bytes") for c in (st, hv)]
        rings = [r for r in rings if r is not None]
        add(
            "ring with pinned staging (MiB)",
            f"<= bound {bound / common.MiB:.0f}",
            mib_of(max(rings)) if rings else None,
            bool(rings) and max(rings) <= bound,
        )
        extra = [
            c[pinned]["peak_used_delta"] - c[pageable]["peak_used_delta"]
            for c in (st, hv)
            if c.get(pinned, {}).get("peak_used_delta") is not None
            and c.get(pageable, {}).get("peak_used_delta") is not None
        ]
        add(
            "peak GPU memory, pinned staging minus pageable fallback (MiB)",
            f"<= {PEAK_SLACK / common.MiB:.0f} (no new GPU allocation)",
            mib_of(max(extra)) if extra else None,
            bool(extra) and max(extra) <= PEAK_SLACK,
            "larger of the staging and heavy checkpoints (mem_get_info)",
        )

    de = res.get("deferred", {}).get("configs", {})
    tp_n = res.get("deferred", {}).get("tp", 8)
    for key, bound_key, what in (
        ("series COPY=0", "incomplete_bound_bytes", "incomplete-layer bound"),
        (f"series COPY=0 tp={tp_n}", "tp_local_bound_bytes", "TP-local size of incomplete layers"),
    ):
        c = de.get(key)
        if c is None:
            continue
        limit, extra = c.get(bound_key), c.get("extra_peak_alloc")
        base = de.get(key.replace("series COPY=0", "base (always copies)"), {})
        add(
            f"deferred extra peak, {key} (MiB)",
            f"<= {what} {fmt(mib_of(limit))}",
            mib_of(extra),
            extra is not None and limit is not None and extra <= limit + ALLOC_SLACK,
            f"base: {fmt(mib_of(base.get('extra_peak_alloc')))} MiB",
        )
    peaks = res.get("deferred", {}).get("processing_peak", {})
    if peaks:
        series, base = peaks.get("series"), peaks.get("base")
        add(
            "peak memory loading + processing one layer (4 x 32 MiB bf16 to fp8), series (MiB)",
            f"<= base {fmt(mib_of(base))}",
            mib_of(series),
            series is not None and base is not None and series <= base,
            "v1: 352 with its release patch, 448 in the base release.s order",
        )
    cpu = res.get("deferred", {}).get("cpu_sources_peak", {})
    if cpu:
        r = cpu.get("ratio")
        add(
            "peak device memory, layerwise load from CPU sources, series / base release",
            "<= 1.00",
            r,
            r is not None and r <= 1.00,
            f"base {fmt(mib_of(cpu.get('base')))} MiB, series {fmt(mib_of(cpu.get('series')))}"
            " MiB; a padded layer completes only in finalize",
        )
    many = res.get("many", {})
    for label, c in many.get("configs", {}).items():
        if "ratio_vs_base" in c and not label.startswith("base"):
            r = c["ratio_vs_base"]
            add(
                f"many tensors: {label} / {c.get('base', 'base release')} (time)",
                "<= 1.03",
                r,
                r is not None and r <= 1.03,
                f"{fmt(c.get('us_per_tensor'), 1)} us per tensor, first tensor after"
                f" {fmt(c.get('first_tensor_s'))} s; best rounds {fmt(c.get('ratio_best'), 3)}",
            )
        if "check_ratio" in c:
            add(
                f"many tensors: retention check cost, {label.split(', ')[-1]} (with / without)",
                "stated",
                c["check_ratio"],
                c["check_ratio"] is not None,
                f"{fmt(c.get('us_per_tensor'), 1)} us per tensor with the check",
            )
    checked = [k for k in de if k.startswith("series ")]
    if checked:
        bad = [de[k].get("n_mismatched_modules") for k in checked]
        add(
            "deferred values bitwise equal (series, whole and TP-like)",
            "0 mismatched modules",
            sum(b for b in bad if b is not None) if None not in bad else None,
            all(b == 0 for b in bad),
            f"{len(checked)} configurations",
        )
    bound_targets(res, add)
    new_row_targets(res, add)
    return targets


def peak_target(add, what: str, c: dict, bound: int, largest_on_gpu: int) -> None:
    """Peak extra device memory of one bounded series row: ``<= B + 16 MiB``
    borrowed, ``<= B + the largest tensor on the GPU`` in copy mode."""
    slack = PEAK_SLACK if c.get("borrowed") else largest_on_gpu
    peak = c.get("peak_used_delta")
    add(
        f"{what}: peak extra device memory (MiB)",
        f"<= B + {slack / common.MiB:.1f} ({'borrowed' if c.get('borrowed') else 'copy'})",
        None if peak is None else peak / common.MiB,
        peak is not None and peak <= bound + slack,
        f"B = {bound / common.MiB:.0f} MiB",
    )


def new_row_targets(res: dict, add) -> None:
    """The bound's peak (staging, heavy, kimi), the Kimi-K2-class mix, the
    draft after its target, the disk rows and the many-tensor minimum."""
    skipped = set(res.get("skipped_phases", []))
    for kind in ("staging", "heavy", "kimi"):
        st = res.get(kind, {})
        for label, c in st.get("configs", {}).items():
            if label.startswith("series") and c.get("bound_bytes") and c.get("runs"):
                peak_target(add, f"{kind} {label}", c, c["bound_bytes"],
                            st.get("largest_on_gpu_bytes") or 0)  # fmt: skip
    if "kimi" not in skipped:
        for label, c in res.get("kimi", {}).get("configs", {}).items():
            if label != "series unbound":
                r = c.get("ratio_vs_unbound")
                add(
                    f"Kimi-K2-class mix, {label} / unbounded (time)",
                    "<= 1.02",
                    r,
                    r is not None and r <= 1.02,
                    f"best rounds {fmt(c.get('ratio_best_vs_unbound'))}",
                )
    if "draft" not in skipped:
        for label, r in res.get("draft", {}).get("rows", {}).items():
            if not label.startswith("series"):
                continue
            ok = r.get("outcome") == "loaded" and r.get("n_mismatches") == 0
            add(f"draft after target, {label}: loads, bitwise", "loaded, 0 mismatched",
                r.get("outcome"), ok, (r.get("failure") or "")[-300:])  # fmt: skip
            ratio = r.get("ratio_vs_safetensors")
            add(f"draft after target, {label} / vLLM safetensors (time)", "<= 1.0", ratio,
                ok and ratio is not None and ratio <= 1.0)  # fmt: skip
            ring, peak = r.get("ring_bytes"), r.get("peak_used_delta")
            add(
                f"draft after target, {label}: peak extra (MiB)",
                "<= chosen bound + 16",
                None if peak is None else peak / common.MiB,
                ok and None not in (ring, peak) and peak <= ring + PEAK_SLACK,
                f"ring {mib(ring)} MiB",
            )
    if "disk" not in skipped:
        for label, c in res.get("disk", {}).get("configs", {}).items():
            add(
                f"disk, {label}: time / the same tree unbounded (page cache dropped)",
                "stated",
                c.get("ratio_vs_unbound"),
                c.get("ratio_vs_unbound") is not None,
                f"median {fmt(c.get('median_s'), 3)} s, io depth {c.get('io_depth')},"
                f" backend {c.get('backend')}",
            )
    for label, c in res.get("many", {}).get("configs", {}).items():
        if "ratio_best" in c and not label.startswith("base"):
            r = c["ratio_best"]
            add(f"many tensors: {label}, best round / base's best", "<= 1.03", r,
                r is not None and r <= 1.03)  # fmt: skip


def bound_targets(res: dict, add) -> None:
    """The ``bound`` phase, per checkpoint: every row bitwise; every ring
    within its bound; and, stated, the series against the series with
    pieces at the 64 MiB bound in copy and borrowed mode (time x unbound of
    each, and the peak extra GPU memory of each)."""
    if "bound" in set(res.get("skipped_phases", [])):
        return
    phase = res.get("bound", {})
    for kind in ("staging", "heavy"):
        st = phase.get(kind, {})
        c = st.get("configs", {})
        bad = [(x.get("verify") or {}).get("n_mismatches") for x in c.values()]
        add(
            f"bound, {kind} checkpoint: every row bitwise equal",
            "0 mismatched tensors",
            sum(b for b in bad if b is not None) if c and None not in bad else None,
            bool(c) and all(b == 0 for b in bad),
            f"{len(c)} rows, every tensor of one verified load each",
        )
        over = [
            label
            for label, x in c.items()
            if x.get("bound_bytes") and (x.get("ring_bytes") or 0) > x["bound_bytes"]
        ]
        rings = [x.get("ring_bytes") for x in c.values() if x.get("bound_bytes")]
        add(
            f"bound, {kind} checkpoint: ring within the bound, every bounded row",
            "<= B",
            len(over) if rings else None,
            bool(rings) and None not in rings and not over,
            ", ".join(over[:3]),
        )
        b = size_label(st.get("bound_bytes") or 64 * common.MiB)
        for mode in ("copy", "borrowed"):
            new, old = c.get(f"series {b}, {mode}", {}), c.get(f"pieces {b}, {mode}", {})
            r = new.get("ratio_vs_unbound")
            add(
                f"bound, {kind} checkpoint, {b} {mode}: series / series unbound (time)",
                "stated",
                r,
                r is not None,
                f"with pieces {fmt(old.get('ratio_vs_unbound'))}; best rounds"
                f" {fmt(new.get('ratio_best_vs_unbound'))} against"
                f" {fmt(old.get('ratio_best_vs_unbound'))}; peak extra GPU"
                f" {mib(new.get('peak_used_delta'))} MiB against"
                f" {mib(old.get('peak_used_delta'))} MiB",
            )


def size_label(n: int) -> str:
    """A bound as the ``bound`` phase's row labels name it (run_all.size_label)."""
    return f"{n / common.MiB:.3g} MiB"


def render_bound(res: dict) -> list[str]:
    """The ``bound`` phase's table per checkpoint."""
    out = []
    phase = res.get("bound", {})
    trees = phase.get("trees", {})
    for kind in ("staging", "heavy"):
        st = phase.get(kind, {})
        if not st.get("configs"):
            continue
        geo = st.get("geometry", {})
        out.append(
            f"## Bound: the series against the series with pieces, {kind} checkpoint"
            f" ({fmt(st.get('checkpoint_gib'))} GiB, largest tensor"
            f" {mib(st.get('largest_tensor_bytes'))} MiB; geometry rule: B ="
            f" {fmt(geo.get('bound_bytes', 0) / common.MiB)} MiB, twice"
            f" {fmt(geo.get('largest_on_gpu_bytes', 0) / common.MiB)} MiB; median and best"
            f" of {st.get('rounds')} interleaved rounds)\n"
        )
        rows = [
            [
                label,
                fmt(c.get("median_s"), 3),
                fmt(c.get("min_s"), 3),
                c.get("ratio_vs_unbound"),
                c.get("ratio_best_vs_unbound"),
                c.get("ratio_vs_pieces"),
                c.get("ratio_best_vs_pieces"),
                mib(c.get("ring_bytes")),
                mib(c.get("peak_used_delta")),
                mib(c.get("peak_host_delta")),
                mib(c.get("cpu_bytes")),
                (c.get("verify") or {}).get("n_mismatches"),
            ]
            for label, c in st["configs"].items()
        ]
        headers = [
            "config",
            "median s",
            "best s",
            "× unbound",
            "× unbound, best",
            "× pieces",
            "× pieces, best",
            "ring MiB",
            "peak extra GPU MiB (mem_get_info)",
            "peak host MiB",
            "CPU MiB",
            "mismatches",
        ]
        out.append(md_table(headers, rows))
        for label in st.get("not_run", []):
            out.append(f"\nNot run: {label}")
        out.append("")
    if trees:
        out.append(
            "Trees: "
            + "; ".join(
                f"{name} {'streams in pieces' if t.get('has_pieces') else 'no pieces'}"
                for name, t in trees.items()
            )
            + ".\n"
        )
    return out


# --- rendering ---------------------------------------------------------------------


def _deferred_bound_key(label: str) -> str:
    """The bound ``evaluate_targets`` holds a deferred configuration to."""
    return "tp_local_bound_bytes" if " tp=" in label else "incomplete_bound_bytes"


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def mib(n, digits: int = 0) -> str:
    return "–" if n is None else f"{n / common.MiB:.{digits}f}"


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_summary(res: dict) -> str:
    out = []
    bundle, machine = res.get("bundle", {}), res.get("machine", {})
    title = "Qualification of the series on the H200"
    if res.get("mode") != "series":
        title += " — SMOKE RUN (base only; 'series' rows ran on the base tree)"
    out.append(f"# {title}\n")
    base = bundle.get("base", {})
    # The status is the procedure's (every step ran, no problem); the targets
    # are a separate verdict, said on the same line so the two are not confused.
    targets = res.get("targets") or []
    missed = sum(not t.get("met") for t in targets)
    verdict = (
        f"; targets missed: {missed} of {len(targets)}"
        if missed
        else f"; targets: all {len(targets)} met"
        if targets
        else ""
    )
    argv = res.get("argv") or []
    # The arguments as typed after the script's name (--out is the tool's $OUT).
    args = [a for i, a in enumerate(argv) if "--out" not in (a, argv[i - 1] if i else "")]
    command = str(res.get("command")).replace(".sh", ".sh " + shlex.join(args), 1)
    out.append(
        f"- status: **{res.get('status', '?')}** (procedure){verdict}; command:"
        f" `{command if args else res.get('command')}`; wall time"
        f" {fmt(res.get('wall_seconds'), 0)} s"
    )
    out.append(
        f"- base: vLLM {base.get('version')} (commit {str(base.get('commit'))[:12]},"
        f" upstream {base.get('upstream_commit')})"
    )
    patches = bundle.get("patches") or []
    out.append(
        "- patches: "
        + (", ".join(f"{p['file']} ({p['patch_id'][:12]})" for p in patches) or "none")
    )
    out.append(
        f"- GPU: {machine.get('gpu')}, driver {machine.get('driver')}, CUDA"
        f" {machine.get('cuda')}, torch {machine.get('torch')}, instanttensor"
        f" {machine.get('instanttensor')}"
    )
    out.append("")

    tests = res.get("tests", {})
    if tests:
        out.append("## Tests on the GPU\n")
        rows = []
        for run_name, run in tests.items():
            if run_name == "negative_controls":
                continue
            for file, c in run.get("files", {}).items():
                rows.append([run_name, file, c["passed"], c["failed"], c["error"], c["skipped"]])
        for ctl in tests.get("negative_controls", []):
            t = ctl.get("totals", {})
            rows.append(
                [
                    f"{ctl['tree']} (control)",
                    ctl["test"],
                    t.get("passed"),
                    t.get("failed"),
                    t.get("error"),
                    t.get("skipped"),
                ]
            )
        out.append(md_table(["run", "file", "passed", "failed", "error", "skipped"], rows))
        for ctl in tests.get("negative_controls", []):
            out.append(
                f"\nNegative control `{ctl['test']}` without {ctl['without_patch']}:"
                f" **{ctl.get('verdict')}**"
            )
        out.append("")

    tp = res.get("throughput", {})
    if tp.get("configs"):
        out.append(
            f"## Load throughput ({fmt(tp.get('checkpoint_gib'))} GiB, "
            f"{tp.get('n_tensors')} tensors, 4 indexed shards in /dev/shm; "
            f"median of {tp.get('rounds')} interleaved runs)\n"
        )
        rows = []
        for label, c in tp["configs"].items():
            rows.append(
                [
                    label,
                    c.get("tree"),
                    c.get("gib_s"),
                    c.get("gb_s"),
                    c.get("ratio_vs_base"),
                    c.get("ratio_vs_pinned"),
                    fmt(c.get("median_s"), 3),
                    fmt(c.get("min_s"), 3),
                    fmt(c.get("time_ratio_best"), 3),
                ]
            )
        rows.append(
            [
                "pinned 1 GiB H2D copy (ceiling)",
                "-",
                tp.get("pinned_gib_s"),
                tp.get("pinned_gb_s"),
                None,
                1.0,
                None,
                None,
                None,
            ]
        )
        rows.append(
            [
                "pageable 1 GiB H2D copy",
                "-",
                tp.get("pageable_gib_s"),
                tp.get("pageable_gb_s"),
                None,
                common.ratio(tp.get("pageable_gib_s"), tp.get("pinned_gib_s")),
                None,
                None,
                None,
            ]
        )
        headers = ["config", "tree", "GiB/s", "GB/s", "× base", "× pinned", "median s"]
        out.append(md_table([*headers, "best s", "time × base, best rounds"], rows))
        out.append(
            "\nRetention check of borrowed tensors: series COPY=0 throughput with the check"
            f" / without it = **{fmt(tp.get('retention_check_ratio'), 3)}**.\n"
        )
        for label in tp.get("not_run", []):
            out.append(f"Not run: {label}\n")

    for kind, title in (
        ("staging", "same checkpoint + one 1 GiB tensor"),
        ("heavy", "synthetic shards 1-2 + three 1 GiB tensors in shards of their own"),
    ):
        st = res.get(kind, {})
        if not st.get("configs"):
            continue
        share = st.get("oversized_fraction")
        out.append(
            f"## Staging bound {mib(st.get('bound_bytes'))} MiB: {title} "
            f"({fmt(st.get('checkpoint_gib'))} GiB"
            + (f", {100 * share:.0f} % of it above the bound" if share else "")
            + f"; median of {st.get('rounds')} interleaved runs)\n"
        )
        rows = [
            [
                label,
                c.get("gib_s"),
                c.get("ratio_vs_unbound"),
                mib(c.get("ring_bytes")),
                mib(c.get("peak_used_delta")),
                mib(c.get("torch_peak_delta")),
                mib(c.get("cpu_bytes")),
                c.get("cpu_gb_s"),
            ]
            for label, c in st["configs"].items()
        ]
        out.append(
            md_table(
                [
                    "config",
                    "GiB/s",
                    "time × unbound",
                    "ring MiB",
                    "peak GPU MiB (mem_get_info)",
                    "peak MiB (torch)",
                    "CPU-fallback MiB",
                    "fallback GB/s (to the GPU copy's end)",
                ],
                rows,
            )
        )
        for label in st.get("not_run", []):
            out.append(f"\nNot run: {label}")
        out.append("")

    out += render_bound(res)
    pr = res.get("pinned_read", {})
    if pr.get("methods"):
        out.append(
            f"## Reading one {mib(pr.get('bytes'))} MiB tensor to the GPU "
            f"(tmpfs shard, preallocated GPU tensor; median of {pr.get('reps')} rounds)\n"
        )
        rows = [
            [
                label,
                m.get("gb_s"),
                fmt(m.get("read_median_s"), 3),
                fmt(m.get("median_s"), 3),
                m.get("is_pinned"),
                m.get("bitwise_equal"),
            ]
            for label, m in pr["methods"].items()
        ]
        out.append(
            md_table(["method", "GB/s", "read s", "read + copy s", "pinned", "bitwise equal"], rows)
        )
        default, best = pr.get("default") or {}, pr.get("best") or {}
        if best:
            out.append(
                f"\nFastest: {best.get('threads')} threads, {mib(best.get('chunk_bytes'))} MiB"
                f" chunks, {fmt(best.get('gb_s'))} GB/s; the series' default"
                f" ({default.get('threads')} threads, {mib(default.get('chunk_bytes'))} MiB"
                f" chunks) {fmt(default.get('gb_s'))} GB/s. Each read makes its own reader,"
                " as a load does (its arena comes from torch's cache of pinned blocks)"
                + (
                    "; each cell sets PINNED_READ_THREADS and PINNED_READ_CHUNK_BYTES for its read."
                    if pr.get("settings") == "module constants"
                    else "."
                )
            )
        elif pr.get("pinned_reader"):
            out.append(f"\nPinned reader: {pr['pinned_reader']}.")
        out.append("")

    de = res.get("deferred", {})
    if de.get("configs"):
        out.append(
            "## Deferred ownership (layerwise online processing, ring bounded; "
            f"tp={de.get('tp')}: rank 0's TP-local parameters, loaders that narrow)\n"
        )
        peaks = de.get("processing_peak") or {}
        if peaks:
            shape = "x".join(map(str, peaks.get("shape", [])))
            out.append(
                f"Peak GPU memory while one layer of four {shape} bf16 parameters is loaded"
                f" from GPU sources and processed (fp8): base release "
                f"**{mib(peaks.get('base'))} MiB**, series **{mib(peaks.get('series'))} MiB**.\n"
            )
        rows = []
        for label, c in de["configs"].items():
            rows.append(
                [
                    label,
                    mib(c.get("extra_peak_alloc"), 1),
                    mib(c.get("extra_held_alloc"), 1),
                    mib(c.get("extra_peak_used"), 1),
                    # The bound the row's target is held to: the whole model's
                    # incomplete layers, or their TP-local share on tp=N rows.
                    mib(c.get(_deferred_bound_key(label)), 1),
                    mib(c.get("materialised_bytes")),
                    c.get("n_mismatched_modules"),
                ]
            )
        out.append(
            md_table(
                [
                    "config",
                    "extra peak MiB (torch)",
                    "held between tensors MiB",
                    "extra peak MiB (mem_get_info: + ring, allocator cache)",
                    "incomplete-layer bound MiB (tp=N rows: TP-local)",
                    "parameters MiB",
                    "mismatched modules",
                ],
                rows,
            )
        )
        for label in de.get("not_run", []):
            out.append(f"\nNot run: {label}")
        out.append("")

    rw = res.get("real_writer", {})
    if rw.get("configs"):
        ck = rw.get("checkpoint", {})
        out.append(
            f"## Real-writer checkpoint ({ck.get('architecture')}, transformers "
            f"{ck.get('transformers')}, {ck.get('n_tensors')} tensors in "
            f"{len(ck.get('files', []))} shards; bound {mib(rw.get('bound_bytes'))} MiB)\n"
        )
        rows = [
            [
                label,
                c.get("tree"),
                c.get("n_tensors"),
                c.get("names_equal"),
                c.get("n_mismatches"),
                c.get("on_cpu"),
                c.get("borrowed_marked"),
                c.get("cpu_pinned"),
                c.get("priority_first"),
            ]
            for label, c in rw["configs"].items()
        ]
        out.append(
            md_table(
                [
                    "config",
                    "tree",
                    "tensors",
                    "names equal",
                    "mismatches",
                    "on CPU",
                    "marked borrowed",
                    "pinned on CPU",
                    "priority first",
                ],
                rows,
            )
        )
        for label in rw.get("not_run", []):
            out.append(f"\nNot run: {label}")
        out.append("")

    many = res.get("many", {})
    if many.get("configs"):
        part = many.get("part", {})
        out.append(
            f"## Many small tensors ({many.get('n_tensors')} tensors of"
            f" {fmt(many.get('tensor_bytes'))} B in {many.get('n_files')} shards; check-cost"
            f" rows: {part.get('n_tensors')} of them; median of {many.get('rounds')}"
            " interleaved rounds)\n"
        )
        rows = [
            [
                label,
                c.get("tree"),
                c.get("median_s"),
                c.get("min_s"),
                fmt(c.get("ratio_vs_base"), 3),
                fmt(c.get("ratio_best"), 3),
                c.get("base", "–"),
                c.get("first_tensor_s"),
                fmt(c.get("us_per_tensor"), 1),
                fmt(c.get("check_ratio"), 3),
            ]
            for label, c in many["configs"].items()
        ]
        out.append(
            md_table(
                [
                    "config",
                    "tree",
                    "seconds",
                    "best s",
                    "× base",
                    "× base, best rounds",
                    "base",
                    "first tensor s",
                    "µs per tensor",
                    "check on / off",
                ],
                rows,
            )
        )
        for label in many.get("not_run", []):
            out.append(f"\nNot run: {label}")
        out.append("")

    tu = res.get("tuning", {})
    if tu.get("grid"):
        out.append("## InstantTensor knobs (series, COPY=0)\n")
        rows = [[g["label"], g.get("gib_s"), g.get("ratio_vs_pinned")] for g in tu["grid"]]
        out.append(md_table(["knobs", "GiB/s", "× pinned"], rows))
        out.append("")

    if res.get("targets"):
        out.append("## Targets\n")
        rows = [
            [t["name"], t["target"], t["value"], t["met"], t.get("note", "")]
            for t in res["targets"]
        ]
        out.append(md_table(["target", "wanted", "measured", "met", "note"], rows))
        out.append("")
    if res.get("problems"):
        out.append("## Problems\n")
        out += [f"- {p}" for p in res["problems"]]
        out.append("")
    out.append("![throughput and memory](qualification.png)\n")
    return "\n".join(out)


def plot(res: dict, path: Path) -> str | None:
    """Throughput, bounded staging, deferred memory and pinned reads; returns
    an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover - the image has matplotlib
        return f"no plot: {e}"
    fig, axes = plt.subplots(2, 2, figsize=(16, 10))
    tp = res.get("throughput", {}).get("configs", {})
    ax = axes[0][0]
    labels = list(tp)
    meds = [tp[k].get("gib_s") or 0 for k in labels]
    lo = [
        m - (tp[k]["bytes"] / common.GiB / tp[k]["max_s"]) if tp[k].get("max_s") else 0
        for k, m in zip(labels, meds, strict=True)
    ]
    hi = [
        (tp[k]["bytes"] / common.GiB / tp[k]["min_s"]) - m if tp[k].get("min_s") else 0
        for k, m in zip(labels, meds, strict=True)
    ]
    ax.bar(range(len(labels)), meds, yerr=[lo, hi], color="tab:blue", capsize=3)
    pinned = res.get("throughput", {}).get("pinned_gib_s")
    if pinned:
        ax.axhline(pinned, color="tab:red", ls="--", label=f"pinned H2D {pinned:.1f} GiB/s")
        ax.legend(fontsize=8, loc="center right")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GiB/s (median, min–max)")
    ax.set_title("Load throughput, ~8 GiB in /dev/shm")

    ax = axes[0][1]
    rows = [
        (f"{kind}: {label}", c)
        for kind in ("staging", "heavy")
        for label, c in res.get(kind, {}).get("configs", {}).items()
    ]
    x = range(len(rows))
    ax.bar(list(x), [c.get("ratio_vs_unbound") or 0 for _, c in rows], color="tab:purple")
    for limit, color in ((1.3, "tab:orange"), (1.6, "tab:red")):
        ax.axhline(limit, color=color, ls="--", label=f"{limit}× unbound")
    ax.legend(fontsize=8)
    ax.set_xticks(list(x), [label for label, _ in rows], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("load time × unbounded (same tree)")
    ax.set_title("Staging bound: pageable fallback against pinned staging")

    de = res.get("deferred", {}).get("configs", {})
    ax = axes[1][0]
    labels = list(de)
    x = range(len(labels))
    extra = [(de[k].get("extra_peak_alloc") or 0) / common.MiB for k in labels]
    bound = [(de[k].get(_deferred_bound_key(k)) or 0) / common.MiB for k in labels]
    ax.bar([i - 0.2 for i in x], extra, width=0.4, color="tab:green", label="extra peak")
    ax.bar([i + 0.2 for i in x], bound, width=0.4, color="tab:gray", label="bound of its target")
    ax.legend(fontsize=8)
    ax.set_xticks(list(x), labels, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("MiB over materialised params")
    ax.set_title("Deferred ownership: extra peak GPU memory")

    methods = res.get("pinned_read", {}).get("methods", {})
    ax = axes[1][1]
    labels = list(methods)
    ax.bar(range(len(labels)), [methods[k].get("gb_s") or 0 for k in labels], color="tab:cyan")
    ax.axhline(20, color="tab:red", ls="--", label="20 GB/s")
    ax.legend(fontsize=8)
    short = [k.replace("pinned reader, ", "").replace(" chunks", "") for k in labels]
    ax.set_xticks(range(len(labels)), short, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("GB/s, read + copy to the GPU")
    ax.set_title("One 1 GiB tensor from tmpfs to the GPU")
    fig.suptitle(
        ("SMOKE (base only) — " if res.get("mode") != "series" else "")
        + f"{res.get('machine', {}).get('gpu') or ''}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
