"""Figures of ``bench serve`` result documents, PNG files of them, and an HTML report.

Each figure function takes one or more result documents (``bench plot`` overlays files, e.g.
ferrollm beside llama-server) and returns a matplotlib `Figure` with one line per document
(per document and level for the CDFs), labelled with the document's ``label``. The x axis of
the sweep figures is ``max_concurrency`` (a level without a limit is drawn at its number of
prompts, all of which may be in flight). Figures are built without pyplot, so no global state
or GUI backend is involved; PNGs are rendered by Agg.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

Document = dict[str, Any]

#: Axis labels of each latency metric.
METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
#: The plots `save_plots` writes: name -> (title, figure function).
PLOT_TITLES = {
    "throughput": "Throughput against concurrency",
    "latency": "Latency against concurrency",
    "ttft_cdf": "TTFT distribution",
    "itl_cdf": "ITL distribution",
}


def concurrency_x(run: dict[str, Any]) -> int:
    """Where a level sits on the concurrency axis."""
    return int(run["max_concurrency"] or run["num_prompts"])


def throughput_figure(documents: Sequence[Document]) -> Figure:
    """Output tokens/s and requests/s against concurrency, one line per document."""
    figure = Figure(figsize=(10, 4), layout="constrained")
    axes = figure.subplots(1, 2)
    for ax, key, ylabel in (
        (axes[0], "output_throughput", "output tokens/s"),
        (axes[1], "request_throughput", "requests/s"),
    ):
        for document in documents:
            runs = sorted(document["runs"], key=concurrency_x)
            ax.plot(
                [concurrency_x(r) for r in runs],
                [r[key] for r in runs],
                marker="o",
                label=document["label"],
            )
        _style(ax, "max concurrency", ylabel)
        _concurrency_axis(ax, documents)
    return figure


def latency_figure(documents: Sequence[Document]) -> Figure:
    """Median TTFT, TPOT, ITL and E2E latency against concurrency (the metrics the documents
    hold), one line per document, shaded up to the highest percentile recorded."""
    metrics = [m for m in METRIC_NAMES if any(_has(d, f"median_{m}_ms") for d in documents)]
    figure = Figure(figsize=(10, 3.5 * ((len(metrics) + 1) // 2)), layout="constrained")
    axes = np.atleast_1d(figure.subplots((len(metrics) + 1) // 2, 2, squeeze=False)).ravel()
    for ax, metric in zip(axes, metrics, strict=False):
        for document in documents:
            runs = sorted(document["runs"], key=concurrency_x)
            x = [concurrency_x(r) for r in runs]
            line = ax.plot(
                x,
                [_num(r.get(f"median_{metric}_ms")) for r in runs],
                marker="o",
                label=document["label"],
            )[0]
            tail = _tail_key(document, metric)
            if tail is not None:
                low = [_num(r.get(f"median_{metric}_ms")) for r in runs]
                ax.fill_between(
                    x, low, [_num(r.get(tail)) for r in runs], color=line.get_color(), alpha=0.15
                )
        _style(ax, "max concurrency", f"{METRIC_NAMES[metric]} median (ms)")
        _concurrency_axis(ax, documents)
    tails = {_tail_key(d, m) for d in documents for m in metrics} - {None}
    if tails:
        names = sorted({str(t).split("_")[0] for t in tails})
        figure.suptitle(f"line: median; band: median to {', '.join(names)}", fontsize="medium")
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    return figure


def cdf_figure(documents: Sequence[Document], metric: str) -> Figure:
    """The CDF of ``metric`` ("ttft": one sample per request; "itl": one per gap), one line
    per document and level."""
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    ax = figure.subplots()
    for document in documents:
        for run in document["runs"]:
            values = np.sort(samples_ms(run, metric))
            if values.size:
                fraction = np.arange(1, values.size + 1) / values.size
                conc = run["max_concurrency"] or "inf"
                ax.plot(
                    values,
                    fraction,
                    drawstyle="steps-post",
                    label=f"{document['label']} conc={conc}",
                )
    unit = "requests" if metric == "ttft" else "inter-token gaps"
    _style(ax, f"{METRIC_NAMES[metric]} (ms)", f"fraction of {unit}")
    ax.set_ylim(0, 1.02)
    return figure


def samples_ms(run: dict[str, Any], metric: str) -> np.ndarray:
    """A level's samples of "ttft" (per successful request) or "itl" (every gap), in ms."""
    if metric == "itl":
        return np.array([gap for gaps in run["itls_ms"] for gap in gaps], dtype=float)
    return np.array([v for v in run[f"{metric}s_ms"] if v is not None], dtype=float)


def figures(documents: Sequence[Document]) -> dict[str, Figure]:
    """Every plot of the documents, by name (the keys of `PLOT_TITLES`)."""
    return {
        "throughput": throughput_figure(documents),
        "latency": latency_figure(documents),
        "ttft_cdf": cdf_figure(documents, "ttft"),
        "itl_cdf": cdf_figure(documents, "itl"),
    }


def save_plots(documents: Sequence[Document], out_dir: Path, stem: str) -> dict[str, Path]:
    """Write ``{stem}-{plot}.png`` for every plot and ``{stem}.html`` embedding them all;
    the paths written by name (``"html"`` for the report)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    pngs: dict[str, bytes] = {}
    for name, figure in figures(documents).items():
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        pngs[name] = buffer.getvalue()
        paths[name] = out_dir / f"{stem}-{name.replace('_', '-')}.png"
        paths[name].write_bytes(pngs[name])
    paths["html"] = out_dir / f"{stem}.html"
    paths["html"].write_text(html_report(documents, pngs), encoding="utf-8")
    return paths


def html_report(documents: Sequence[Document], pngs: dict[str, bytes]) -> str:
    """A self-contained page: a table of every level's main numbers, then each PNG inline."""
    rows = "".join(_row(d, r) for d in documents for r in d["runs"])
    header = "".join(f"<th>{html.escape(title)}</th>" for title, _ in _COLUMNS)
    images = "".join(
        f'<h2>{html.escape(PLOT_TITLES[name])}</h2><img alt="{name}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for name, png in pngs.items()
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>ferrollm bench</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
        "img{max-width:100%}</style></head><body><h1>ferrollm bench serve</h1>"
        f"<table><tr>{header}</tr>{rows}</table>{images}</body></html>\n"
    )


_COLUMNS = (
    ("label", "label"),
    ("model", "model"),
    ("max concurrency", "max_concurrency"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("req/s", "request_throughput"),
    ("output tok/s", "output_throughput"),
    ("total tok/s", "total_token_throughput"),
    ("goodput req/s", "request_goodput"),
    ("median TTFT ms", "median_ttft_ms"),
    ("median ITL ms", "median_itl_ms"),
    ("median E2EL ms", "median_e2el_ms"),
)


def _row(document: Document, run: dict[str, Any]) -> str:
    merged = {**document, **run}
    cells = []
    for _, key in _COLUMNS:
        value = merged.get(key)
        text = f"{value:.2f}" if isinstance(value, float) else "" if value is None else str(value)
        cells.append(f"<td>{html.escape(text)}</td>")
    return f"<tr>{''.join(cells)}</tr>"


def _concurrency_axis(ax: Any, documents: Sequence[Document]) -> None:
    """A log2 axis ticked at the levels run (sweeps are usually 1, 4, 16, ...)."""
    levels = sorted({concurrency_x(r) for d in documents for r in d["runs"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.minorticks_off()


def _style(ax: Any, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def _has(document: Document, key: str) -> bool:
    return any(run.get(key) is not None for run in document["runs"])


def _tail_key(document: Document, metric: str) -> str | None:
    """The key of the highest percentile of ``metric`` the document holds, if any."""
    qs = [float(q) for q in document.get("metric_percentiles", ())]
    keys = [f"p{int(q) if q.is_integer() else q}_{metric}_ms" for q in sorted(qs, reverse=True)]
    return next((k for k in keys if _has(document, k)), None)


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)
