"""Pool the many-tensor rounds of the runs in this folder and in
../h200-final: every load of a configuration, whichever run it came from,
against every load of its base (v0.33.0, or v0.33.0 with its ring at the
bound for the bounded rows). Run from the repository root:
python3 qualification/h200-final-many/pool.py"""

import json
import statistics
from pathlib import Path

here = Path(__file__).parent
runs = [here.parent / "h200-final", *sorted(p for p in here.iterdir() if p.is_dir())]
pool: dict[str, list[float]] = {}
for run in runs:
    many = json.loads((run / "qualification.json").read_text())["many"]
    for label, config in many["configs"].items():
        pool.setdefault(label, []).extend(config["seconds"])
print(f"runs: {', '.join(str(r.relative_to(here.parent)) for r in runs)}\n")
print("| config | loads | × base, median | × base, mean | × base, best |")
print("|---|---|---|---|---|")
for label, seconds in pool.items():
    if label.startswith("check cost"):
        continue
    bounded = label.startswith("series bound")
    base = pool[next(k for k in pool if k.startswith("base") and ("BUFFER" in k) == bounded)]
    ratios = [
        statistics.median(seconds) / statistics.median(base),
        statistics.mean(seconds) / statistics.mean(base),
        min(seconds) / min(base),
    ]
    print(f"| {label} | {len(seconds)} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
