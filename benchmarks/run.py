"""Run the benchmarks of nemo_kubeflow and print one table: ours vs NeMo-Run's built-in
KubeflowExecutor, measured in the same run on the bundled local cluster.

    python benchmarks/run.py                 # everything (about 14 minutes on a quiet 2-core machine, more under load)
    python benchmarks/run.py --quick         # smaller sizes, fewer repeats (about 2 minutes)
    python benchmarks/run.py --only latency,imports --repeat 5
    python benchmarks/run.py --check         # exit 1 when a target is missed

Writes the same table as markdown to benchmarks/results/latest.md (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Detail, Metric, fmt, table  # noqa: E402

#: Benchmark families, in the order they run (cheapest and cluster-free first).
FAMILIES = (
    "imports",
    "cli",
    "packaging",
    "requests",
    "latency",
    "status",
    "logs",
    "firststep",
    "recovery",
    "progress",
    "apiload",
    "sweep",
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (about 2 minutes)")
    parser.add_argument("--repeat", type=int, help="runs per measurement, medians reported (default 5, quick 2)")
    parser.add_argument("--only", help=f"comma-separated families: {', '.join(FAMILIES)}")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "latest.md",
        help="markdown results file (default: benchmarks/results/latest.md)",
    )
    args = parser.parse_args(argv)
    args.families = FAMILIES if not args.only else tuple(f.strip() for f in args.only.split(",") if f.strip())
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    args.repeat = args.repeat or (2 if args.quick else 5)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def render(args, info: dict, metrics: list[Metric], details: list[Detail], failures: list[str], seconds: float) -> str:
    rows = [
        [
            m.name,
            _value(m.ours, m.unit),
            _value(m.baseline, m.unit),
            "" if m.ratio is None else f"{m.ratio:.2f}x",
            m.target,
            {True: "yes", False: "**NO**", None: ""}[m.met],
            m.note,
        ]
        for m in metrics
    ]
    mode = "quick" if args.quick else "full"
    lines = [
        "# nemo_kubeflow benchmarks",
        "",
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, {mode} run, medians of {args.repeat} "
        f"(`{' '.join(['python', 'benchmarks/run.py'] + sys.argv[1:])}`), {seconds:.0f} s.",
        "Baseline: NeMo-Run's built-in `nemo_run.KubeflowExecutor` (one bare TrainJob, no code shipped), "
        "measured in the same run; ratio = ours / baseline.",
        "",
    ]
    lines += table(["metric", "ours", "baseline", "ratio", "target", "met?", "note"], rows)
    if failures:
        lines += ["", "Crashed families:", ""] + [f"- {f}" for f in failures]
    lines += ["", "## Machine", ""] + [f"- {k}: {v}" for k, v in info.items()]
    for detail in details:
        lines += ["", f"## {detail.title}", ""] + detail.lines
    return "\n".join(lines) + "\n"


def _value(value, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{fmt(value)} {unit}".strip()


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    metrics: list[Metric] = []
    details: list[Detail] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="nk-bench-") as workdir:
        ctx = harness.Context(quick=args.quick, repeat=args.repeat, workdir=workdir)
        try:
            for family in args.families:
                module = importlib.import_module(f"bench_{family}")
                print(f"[{time.perf_counter() - started:5.0f} s] {family} ...", file=sys.stderr, flush=True)
                try:
                    for item in module.run(ctx):
                        (details if isinstance(item, Detail) else metrics).append(item)
                        if isinstance(item, Metric):
                            print(
                                f"        {item.name}: {_value(item.ours, item.unit)} "
                                f"(baseline {_value(item.baseline, item.unit)})",
                                file=sys.stderr,
                                flush=True,
                            )
                except Exception:
                    failures.append(f"{family}: {traceback.format_exc().strip().splitlines()[-1]}")
                    traceback.print_exc()
        finally:
            if ctx._cluster is not None:
                try:
                    details.append(
                        Detail(
                            "Local-cluster health in this run",
                            [
                                f"- pods left after their TrainJob was deleted, removed by the harness: "
                                f"{ctx._cluster.orphan_pods} (0 expected)",
                            ],
                        )
                    )
                except Exception:  # the cluster process is gone: nothing to report
                    pass
            ctx.close()
    text = render(args, harness.machine(), metrics, details, failures, time.perf_counter() - started)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"written to {args.output}", file=sys.stderr)
    if failures:
        return 2
    if args.check and any(m.met is False for m in metrics):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
