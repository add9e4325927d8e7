"""Turn a run's results into verdicts, a markdown summary and a plot.

Standard library only (matplotlib is imported by ``plot`` alone), so the
tooling tests exercise it on a CPU machine with made-up results.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import common

BOUND = 64 * common.MiB


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
    }


def evaluate_targets(res: dict) -> list[dict]:
    """The issue's targets, each with the measured value and whether it holds."""
    targets = []

    def add(name, target, value, met, note=""):
        targets.append({"name": name, "target": target, "value": value, "met": met, "note": note})

    tp = res.get("throughput", {}).get("configs", {})
    base = tp.get("base InstantTensor", {}).get("gib_s")
    aa = common.ratio(tp.get("base InstantTensor (A/A repeat)", {}).get("gib_s"), base)
    noise = f"A/A repeat of the base: {aa:.3f}" if aa else ""
    for label in ("series COPY=1", "series COPY=0"):
        r = common.ratio(tp.get(label, {}).get("gib_s"), base)
        add(f"throughput {label} / base", ">= 0.97", r, r is not None and r >= 0.97, noise)
    pinned = res.get("throughput", {}).get("pinned_gib_s")
    best = res.get("tuning", {}).get("best", {})
    best_rate = max(
        [
            v
            for v in (
                best.get("gib_s"),
                tp.get("series COPY=1", {}).get("gib_s"),
                tp.get("series COPY=0", {}).get("gib_s"),
            )
            if v
        ],
        default=None,
    )
    r = common.ratio(best_rate, pinned)
    add(
        "series best / pinned H2D ceiling (ambitious)",
        ">= 0.80",
        r,
        r is not None and r >= 0.80,
        best.get("label", ""),
    )

    st = res.get("staging", {}).get("configs", {})
    sb, bb = st.get("series bound=64MiB", {}), st.get("base bound=64MiB", {})
    rate = sb.get("cpu_gb_s")
    add("CPU-fallback bytes move at (GB/s)", ">= 10", rate, rate is not None and rate >= 10)
    ring = sb.get("ring_bytes")
    add(
        "series ring with bound 64 MiB (MiB)",
        "<= 64",
        ring / common.MiB if ring else None,
        ring is not None and ring <= BOUND,
    )
    if bb.get("peak_used_delta") is not None and sb.get("peak_used_delta") is not None:
        saved = bb["peak_used_delta"] - sb["peak_used_delta"]
        needed = (bb.get("ring_bytes") or 0) - (ring or 0)
        add(
            "peak GPU memory saved vs base (MiB)",
            f">= ring difference {needed / common.MiB:.0f}",
            saved / common.MiB,
            saved >= needed,
        )
    de = res.get("deferred", {}).get("configs", {})
    owned = de.get("series COPY=0", {})
    if owned:
        bound = owned.get("incomplete_bound_bytes") or 0
        extra = owned.get("extra_peak_alloc")
        add(
            "deferred ownership extra peak (MiB)",
            f"<= incomplete layers {bound / common.MiB:.0f}",
            extra / common.MiB if extra is not None else None,
            extra is not None and extra <= bound + 2 * common.MiB,
        )
        add(
            "deferred ownership values bitwise equal",
            "0 mismatched modules",
            owned.get("n_mismatched_modules"),
            owned.get("n_mismatched_modules") == 0,
        )
    return targets


# --- rendering ---------------------------------------------------------------------


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def mib(n) -> str:
    return "–" if n is None else f"{n / common.MiB:.0f}"


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
    out.append(
        f"- status: **{res.get('status', '?')}**; command: `{res.get('command')}`;"
        f" wall time {fmt(res.get('wall_seconds'), 0)} s"
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
            f"median of {tp.get('repeats')} interleaved runs)\n"
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
            ]
        )
        out.append(md_table(["config", "tree", "GiB/s", "GB/s", "× base", "× pinned"], rows))
        out.append("")

    st = res.get("staging", {})
    if st.get("configs"):
        out.append(
            "## Staging bound (same checkpoint + one 1 GiB tensor, "
            "INSTANTTENSOR_BUFFER_SIZE = 64 MiB)\n"
        )
        rows = []
        for label, c in st["configs"].items():
            rows.append(
                [
                    label,
                    c.get("gib_s"),
                    mib(c.get("ring_bytes")),
                    mib(c.get("peak_used_delta")),
                    mib(c.get("cpu_bytes")),
                    c.get("cpu_gb_s"),
                    c.get("ratio_vs_unbound"),
                ]
            )
        out.append(
            md_table(
                [
                    "config",
                    "GiB/s",
                    "ring MiB",
                    "peak GPU MiB (mem_get_info)",
                    "CPU-fallback MiB",
                    "fallback GB/s",
                    "time × unbound",
                ],
                rows,
            )
        )
        out.append("")

    de = res.get("deferred", {})
    if de.get("configs"):
        out.append("## Deferred ownership (layerwise online processing, ring 64 MiB)\n")
        rows = []
        for label, c in de["configs"].items():
            rows.append(
                [
                    label,
                    mib(c.get("extra_peak_alloc")),
                    mib(c.get("extra_peak_used")),
                    mib(c.get("incomplete_bound_bytes")),
                    mib(c.get("model_bytes")),
                    c.get("n_mismatched_modules"),
                ]
            )
        out.append(
            md_table(
                [
                    "config",
                    "extra peak MiB (torch)",
                    "extra peak MiB (mem_get_info: + ring, allocator cache)",
                    "incomplete-layer bound MiB",
                    "model MiB",
                    "mismatched modules",
                ],
                rows,
            )
        )
        out.append("")

    rw = res.get("real_writer", {})
    if rw.get("configs"):
        ck = rw.get("checkpoint", {})
        out.append(
            f"## Real-writer checkpoint ({ck.get('architecture')}, transformers "
            f"{ck.get('transformers')}, {ck.get('n_tensors')} tensors in "
            f"{len(ck.get('files', []))} shards)\n"
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
                ],
                rows,
            )
        )
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
    """Throughput and peak memory per configuration; returns an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover - the image has matplotlib
        return f"no plot: {e}"
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    tp = res.get("throughput", {}).get("configs", {})
    ax = axes[0]
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
        ax.axhline(0.8 * pinned, color="tab:orange", ls=":", label="0.80 × pinned")
        ax.legend(fontsize=8, loc="center right")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GiB/s (median, min–max)")
    ax.set_title("Load throughput, ~8 GiB in /dev/shm")

    st = res.get("staging", {}).get("configs", {})
    ax = axes[1]
    labels = list(st)
    peak = [(st[k].get("peak_used_delta") or 0) / common.MiB for k in labels]
    ring = [(st[k].get("ring_bytes") or 0) / common.MiB for k in labels]
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], peak, width=0.4, label="peak GPU memory over params")
    ax.bar([i + 0.2 for i in x], ring, width=0.4, label="InstantTensor ring")
    ax.set_xticks(list(x), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title("Staging bound 64 MiB + one 1 GiB tensor")
    ax.legend(fontsize=8)

    de = res.get("deferred", {}).get("configs", {})
    ax = axes[2]
    labels = list(de)
    extra = [(de[k].get("extra_peak_alloc") or 0) / common.MiB for k in labels]
    ax.bar(range(len(labels)), extra, color="tab:green")
    bound = next((c.get("incomplete_bound_bytes") for c in de.values()), None)
    if bound:
        ax.axhline(bound / common.MiB, color="tab:red", ls="--", label="incomplete-layer bound")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("MiB over materialised params")
    ax.set_title("Deferred ownership: extra peak GPU memory")
    fig.suptitle(
        ("SMOKE (base only) — " if res.get("mode") != "series" else "")
        + f"{res.get('machine', {}).get('gpu', '')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
