"""PNG plots of a run: ``python -m benchmarks.plot RESULTS.json OUT_DIR STAMP``.

Runs in the plotting virtualenv (``benchmarks/.venvs/_plot``, matplotlib only);
prints the name of each file it writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STEPS = 1000


def _cdf(ax: Any, results: list[dict[str, Any]], case: str) -> bool:
    drawn = False
    palette = list(plt.get_cmap("tab10").colors)
    colors: dict[str, Any] = {}
    ys = [100 * k / STEPS for k in range(STEPS + 1)]
    for r in results:
        if r.get("case") != case or not r.get("ok"):
            continue
        cdf = r.get("cdf", {})
        if "redis_lateness_ms" in cdf:  # delayq: its own measure, drawn boldest
            ax.plot(cdf["redis_lateness_ms"], ys, color="black", lw=2.6,
                    label=f"{r['label']} (Delivery.lateness_ms, Redis clock)")  # fmt: skip
        if "lateness_ms" in cdf:
            style = (
                ":" if "redis_lateness_ms" in cdf else ("--" if r["variant"] != "default" else "-")
            )
            # one colour per library; its labelled variants dashed in the same colour
            if r["library"] not in colors:
                colors[r["library"]] = palette[len(colors) % len(palette)]
            color = "black" if "redis_lateness_ms" in cdf else colors[r["library"]]
            ax.plot(cdf["lateness_ms"], ys, style, color=color, label=r["label"], lw=1.5)
        drawn = True
    if drawn:
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("lateness: handler start − due time (ms, symlog)")
        ax.set_ylabel("events (%)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return drawn


def _bars(ax: Any, labels: list[str], series: dict[str, list[float | None]], ylabel: str,
          log: bool = False) -> None:  # fmt: skip
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [k + i * width for k in range(len(labels))]
        heights = [v if v is not None else 0 for v in values]
        bars = ax.bar(xs, heights, width, label=name)
        for bar, v in zip(bars, values, strict=True):
            text = "–" if v is None else (f"{v:,.0f}" if v >= 10 else f"{v:.1f}")
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=6)  # fmt: skip
    ax.set_xticks([k + width * (len(series) - 1) / 2 for k in range(len(labels))])
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(True, axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)


def _metric(results: list[dict[str, Any]], label: str, case: str, key: str) -> float | None:
    for r in results:
        if r["label"] == label and r.get("case") == case and r.get("ok"):
            return r["metrics"].get(key)
    return None


def main(argv: list[str]) -> None:
    """Write the plots of one results file."""
    path, out_dir, stamp = Path(argv[0]), Path(argv[1]), argv[2]
    data = json.loads(path.read_text())
    results = data["results"]
    written = []
    title = (
        f"{data['machine']['nproc']} CPUs, Redis {data['redis']['version']}, {data['started'][:10]}"
    )

    params = {r.get("case"): r.get("params", {}) for r in results}
    lat, sus = params.get("lateness", {}), params.get("sustained", {})
    for case, name, heading in (
        ("lateness", "lateness-cdf",
         f"Lateness, {lat.get('n', 0):,} events with delays spread over {lat.get('spread')} s"),
        ("sustained", "sustained-cdf",
         f"Lateness at {sus.get('rate', 0):,.0f} events/s for {sus.get('duration')} s"),
    ):  # fmt: skip
        fig, ax = plt.subplots(figsize=(10, 6))
        if _cdf(ax, results, case):
            ax.set_title(f"{heading} ({title})", fontsize=10)
            fig.tight_layout()
            fig.savefig(out_dir / f"{stamp}-{name}.png", dpi=110)
            written.append(f"{stamp}-{name}.png")
        plt.close(fig)

    labels = []
    for r in results:
        if r.get("case") == "throughput-1p" and r["label"] not in labels:
            labels.append(r["label"])
    if labels:
        fig, axes = plt.subplots(1, 2, figsize=(12, 5))
        _bars(axes[0], labels, {
            "1 process": [_metric(results, lab, "throughput-1p", "rate") for lab in labels],
            "2 processes": [_metric(results, lab, "throughput-2p", "rate") for lab in labels],
        }, "events/s (log)", log=True)  # fmt: skip
        axes[0].set_title("End-to-end throughput, events due now", fontsize=10)
        _bars(axes[1], labels, {
            "1 process": [_metric(results, lab, "throughput-1p", "cpu_per_event_us")
                          for lab in labels],
            "2 processes": [_metric(results, lab, "throughput-2p", "cpu_per_event_us")
                            for lab in labels],
        }, "client CPU per event (µs, log)", log=True)  # fmt: skip
        axes[1].set_title("Client CPU per handled event", fontsize=10)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out_dir / f"{stamp}-throughput.png", dpi=110)
        written.append(f"{stamp}-throughput.png")
        plt.close(fig)

    crash = [r for r in results if r.get("case") == "crash" and r.get("ok")]
    memory = [r for r in results if r.get("case") == "memory" and r.get("ok")]
    if crash or memory:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        if crash:
            labs = [r["label"] for r in crash]
            vals = [r["metrics"].get("recovery_s") for r in crash]
            cap = max((r["metrics"].get("cap_s") or 0) for r in crash)
            bars = axes[0].bar(labs, [v if v is not None else cap for v in vals],
                               color=["C0" if v is not None else "0.8" for v in vals])  # fmt: skip
            for bar, v in zip(bars, vals, strict=True):
                text = f"{v:.0f} s" if v is not None else f"> {cap:.0f} s"
                axes[0].annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                 ha="center", va="bottom", fontsize=7)  # fmt: skip
            axes[0].set_ylabel("seconds until the event runs again")
            axes[0].set_title("Crash recovery (grey: not within the cap)", fontsize=10)
            axes[0].tick_params(axis="x", rotation=20, labelsize=8)
        if memory:
            _bars(axes[1], [r["label"] for r in memory], {
                "bytes/event": [r["metrics"]["bytes_per_event"] for r in memory],
            }, "Redis bytes per scheduled event (100 B payload)")  # fmt: skip
            axes[1].set_title("Redis memory per scheduled event", fontsize=10)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out_dir / f"{stamp}-recovery-memory.png", dpi=110)
        written.append(f"{stamp}-recovery-memory.png")
        plt.close(fig)
    for name in written:
        print(name)


if __name__ == "__main__":
    main(sys.argv[1:])
