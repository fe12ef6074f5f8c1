#!/usr/bin/env python
"""``docs/results.md``: each seed paper's headline claim beside cadence's figure, rendered from
``benchmarks/results/*.json`` only (issue 49), and the README's short table of them.

    .venv/bin/python benchmarks/results_page.py [--write]      # make results

One section per paper: its claim and number (the paper's, quoted from ``../shared/SPEC.md``), the
setting cadence measured it in, cadence's figure and the ratio, the result file, its commit and
machine; a plot (SVG beside the page, ``docs/results/``) where the paper's figure has a counterpart
here. A result file from an uncommitted tree, or one that records no commit, is **refused**: the
section names it and what it would show, and quotes no number from it. What a paper claims and
cadence has not measured yet is said as such, never filled in.

Without ``--write`` the page is printed. ``tests/benchmarks/test_results_page.py`` renders it again and
fails where ``docs/results.md`` or the README's table differs from what the result files give.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import doc_tables  # same folder: a generated block between markers

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "results.md"
FIGURES = REPO / "docs" / "results"
README = REPO / "README.md"
README_BLOCK = "paper-results"
SCRIPT = "results_page.py"


class Refused(Exception):
    """A result file the page will not quote (uncommitted tree, no commit recorded, missing)."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")
        self.name, self.why = name, why


@dataclass
class Source:
    """A result file the page quotes, with the commit and machine it was measured on."""

    name: str
    data: dict[str, Any]
    commit: str
    machine: str

    def cite(self) -> str:
        return f"`benchmarks/results/{self.name}` at {self.commit[:7]}, {self.machine}"


def provenance(data: dict[str, Any]) -> tuple[str | None, bool]:
    """(the commit a result file was measured at, whether its tree had uncommitted changes); the
    older files record them in ``machine`` (``git_commit``, ``git_dirty``)."""
    record = data.get("provenance")
    if isinstance(record, dict):
        return record.get("commit"), bool(record.get("dirty"))
    machine = data.get("machine")
    if isinstance(machine, dict) and "git_commit" in machine:
        return machine.get("git_commit"), bool(machine.get("git_dirty", True))
    return None, True


def describe_machine(data: dict[str, Any]) -> str:
    machine = data.get("machine") or {}
    if machine.get("gpu"):
        return f"one {machine['gpu']}, {machine.get('cpu_count')} CPU cores"
    cpus = machine.get("cpu_count") or machine.get("cpus") or data.get("cpus") or data.get("cores")
    return f"{cpus}-core CPU" if cpus else "machine not recorded"


def load(name: str, folder: Path = RESULTS) -> Source:
    """``folder/name`` as a ``Source``, or ``Refused`` (missing, uncommitted tree, no commit)."""
    path = folder / name
    if not path.exists():
        raise Refused(name, "not measured yet (no such result file)")
    data = json.loads(path.read_text())
    commit, dirty = provenance(data)
    if commit is None:
        raise Refused(name, "refused: it records no commit (measured before results carried one)")
    if dirty:
        raise Refused(name, f"refused: measured from a tree with uncommitted changes (at {commit[:7]})")
    return Source(name, data, commit, describe_machine(data))


@dataclass
class Figure:
    """A plot: ``series`` label -> (xs, ys), drawn as lines with markers."""

    name: str  # file stem under docs/results/
    title: str
    xlabel: str
    ylabel: str
    xs_labels: list[str] | None  # categories along x; None: each series is [x, y] points
    series: dict[str, list]
    reference: tuple[str, float] | None = None  # a horizontal line (label, y)

    def digest(self) -> str:
        """A hash of what the figure shows (the page records it: a changed number changes the page)."""
        body = json.dumps([self.title, self.xs_labels, self.series, self.reference], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def draw(self, folder: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.rcParams["svg.hashsalt"] = "cadence"  # stable element ids
        figure, axes = plt.subplots(figsize=(6.4, 3.6))
        positions = list(range(len(self.xs_labels or [])))
        for label, values in self.series.items():
            points = (values if self.xs_labels is None else
                      [(x, y) for x, y in zip(positions, values) if y is not None])
            axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
        if self.reference is not None:
            axes.axhline(self.reference[1], color="grey", linestyle="--", label=self.reference[0])
        if self.xs_labels is not None:
            axes.set_xticks(positions, self.xs_labels)
        axes.set(title=self.title, xlabel=self.xlabel, ylabel=self.ylabel)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.svg"
        figure.savefig(path, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(figure)
        return path


@dataclass
class Section:
    """One paper: what it claims, and what cadence's result files show of it."""

    title: str
    claim: str  # the paper's headline, its words and numbers (SPEC.md)
    headline: str  # the same in a few words (the README's table)
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)  # measure, paper, cadence, ratio
    lines: list[str] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # what the paper shows that is not measured here
    short: str = ""  # the README's one-line figure

    def use(self, name: str, folder: Path) -> Source | None:
        try:
            source = load(name, folder)
        except Refused as refused:
            if (folder / name).exists():  # (a file not measured yet is what ``missing`` says)
                self.refused.append(refused)
            return None
        self.sources.append(source)
        return source


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}{suffix}"


# ---- the five papers ----------------------------------------------------------------------------------
def oac(section: Section, folder: Path) -> None:
    disk = section.use("out_of_core.json", folder)
    if disk is not None:
        ratios, setting = disk.data["ratios"], disk.data["setting"]
        mrr = {name: disk.data["strategies"][name]["test_mrr"]["mean"] for name in ("sync", "async", "oac")}
        replay = disk.data.get("oac_replay", {})
        section.lines.append(
            f"Out of core: a {setting['entities']:,}-entity table of dim {setting['dim']} "
            f"({setting['table_mib']:,} MiB) memory-mapped under a {setting['memory_cap_mib']} MiB cap, "
            f"DistMult, batch {setting['batch_size']:,}, {setting['negatives']} negatives, one epoch.")
        section.rows += [
            ("OAC's speed against async's", "as fast (6,500 s vs async's ~6,500 s)", f"{ratios['oac_over_async']:.2f}x",
             f"{ratios['oac_over_async']:.2f}"),
            ("OAC's speed against sync's", "~1.9x (12,500 s / 6,500 s)", f"{ratios['oac_over_sync']:.2f}x",
             f"{ratios['oac_over_sync'] / (12500 / 6500):.2f}"),
            ("OAC's model against a sync run in its order", "equal (same MRR)",
             "bit for bit" if replay.get("bit_identical") else "differs", ""),
        ]
        section.lines.append(f"Test MRR after one epoch (means): sync {mrr['sync']:.4f}, async {mrr['async']:.4f}, "
                             f"OAC {mrr['oac']:.4f}: one epoch of a 2M-entity graph is far from converged.")
        section.short = f"{ratios['oac_over_async']:.2f}x async, {ratios['oac_over_sync']:.2f}x sync out of core; sync's model bit for bit"
    curve = section.use("out_of_core_time_to_accuracy_curve.json", folder)
    if curve is not None:
        oac_curve(section, curve)
    else:
        section.missing.append("the paper's figure, MRR against training time to sync's best MRR (issue 49, item 3)")
    rising = section.use("out_of_core_time_to_accuracy_lr001.json", folder)  # a tenth of the rate: a curve that rises
    if rising is not None:
        oac_curve(section, rising, "lr001")
    gpu = section.use("gpu_check_fb15k_946ccb1.json", folder)
    if gpu is not None:
        part = gpu.data["parts"]["kge-fb15k-complex"]["summary"]
        rate = {key.split("@")[0]: row["examples_per_second"]["mean"] for key, row in part.items()}
        section.rows.append(("On a GPU, FB15k-sized ComplEx d400 (one rep), OAC against async",
                             "as fast", f"{rate['oac'] / rate['async']:.2f}x", f"{rate['oac'] / rate['async']:.2f}"))


def oac_curve(section: Section, source: Source, tag: str = "") -> None:
    """The paper's figure: validation MRR against training seconds for sync, async and OAC, out of
    core on slow storage, one curve per strategy (the mean over the repetitions, epoch by epoch), and
    the seconds each takes to the best of sync's curve (``out_of_core.py --curve``); a figure per
    read latency."""
    data, setting = source.data, source.data["setting"]
    latencies = data["slowfs"]["latencies"]
    repetitions = len(next(iter(latencies.values()))["runs"]["sync"])
    rate = next((item.split("=", 1)[1] for item in setting["overrides"] if item.startswith("optimizer.lr=")), None)
    section.lines.append(
        f"Time to accuracy{f' at learning rate {rate}' if rate else ''} "
        f"({repetitions} reps, {setting['eval_triples']} validation triples, each ranked against "
        f"1,000 sampled entities): {setting['entities']:,} entities x dim {setting['dim']}, "
        f"{setting['edges']:,} edges an epoch, {setting['epochs']} epochs, the store on a filesystem whose reads take "
        f"{' or '.join(f'{float(lat):g} ms' for lat in latencies)} each (a FUSE server, `benchmarks/slowfs.py`) under a "
        f"{setting['memory_cap_mib']} MiB cap; each curve the mean over the repetitions, epoch by epoch"
        + (f" (summarized at {data['summarized']['commit'][:7]}: `out_of_core.py --resummarize`)."
           if data.get("summarized") else "."))
    for latency, part in latencies.items():
        mean = part["time_to_accuracy"]["mean_curve"]
        at = f"{float(latency):g} ms a read" + (f", lr {rate}" if rate else "")
        seconds = {name: mean["seconds"][name] for name in ("sync", "async", "oac")}
        ratio = mean["sync_over"]["oac"]
        section.rows.append((f"time to sync's best MRR ({mean['target']:.3f}), sync / OAC, {at}", "up to 3x",
                             "never" if ratio is None else f"{ratio:.2f}x", ""))
        section.rows.append((f"seconds to it, {at}: sync, async, OAC", "OAC sooner; async later or never",
                             ", ".join("never" if value is None else f"{value:,.0f}" for value in seconds.values()), ""))
        near = mean.get("within_noise")
        if near is not None:  # (OAC is a sync run in another order: equal to sync's within the seeds' noise)
            section.rows.append((f"time to sync's best less the seeds' paired noise ({near['target']:.3f}: "
                                 f"-{near['tolerance']:.3f}), sync / OAC, {at}", "up to 3x",
                                 fmt(near["sync_over"]["oac"], 2, "x"), ""))
        best = {name: max(mrr for _, mrr in mean["curves"][name]) for name in ("sync", "async", "oac")}
        section.rows.append((f"best validation MRR of the curve, {at}: sync, async, OAC", "OAC = sync; async lower",
                             f"{best['sync']:.3f}, {best['async']:.3f}, {best['oac']:.3f}", ""))
        per_repetition = part["time_to_accuracy"]["sync_over"]["oac"]
        section.lines.append(
            f"At {at}, each repetition against its own sync run's best single validation (a maximum over sampled "
            f"validations: equal models reach each other's best about half the time): sync / OAC "
            + ", ".join("never" if r is None else f"{r:.2f}x" for r in per_repetition) + ".")
        series = {name: [[round(t, 2), round(mrr, 4)] for t, mrr in curve] for name, curve in mean["curves"].items()}
        section.figures.append(Figure(f"oac_time_to_accuracy_{float(latency):g}ms{'_' + tag if tag else ''}".replace(".", "_"),
                                      f"Validation MRR against training time, {at}",
                                      "training seconds (each point an epoch)", "validation MRR (mean over repetitions)",
                                      None, series, reference=("sync's best", round(mean["target"], 4))))


def adapm(section: Section, folder: Path) -> None:
    table = section.use("adapm_table2_8nodes.json", folder)
    if table is not None:
        rows = table.data["table2"]["8_nodes"]
        ratio = rows["adaptive"]["bytes_per_epoch"] / rows["replication"]["bytes_per_epoch"]
        threads = table.data["table2"]["threads_per_node"]
        section.lines.append(f"Zipf MF, 100k x 10k, 1M ratings, d32, 8 nodes x {threads} worker threads as threads of "
                             "one process, the paper's App. C partitioning.")
        section.rows += [
            ("bytes, AdaPM / replication-only, 8 nodes", "0.11", f"{ratio:.2f}", f"{ratio / 0.11:.1f}x the paper's"),
            ("remote accesses", "< 0.01%", f"{100 * rows['adaptive']['remote_access_share']:.3f}%", ""),
        ]
        section.short = f"bytes {ratio:.2f}x replication-only at 8 nodes (paper 0.11x)"
    scaling = section.use("adapm_scaling.json", folder)
    if scaling is not None:
        for task, label in (("mf", "MF"), ("kge", "KG")):
            nodes = scaling.data["tasks"].get(task, {})
            at8 = nodes.get("8", {}).get("parallel_efficiency", {}) if isinstance(nodes, dict) else {}
            if at8:
                efficiency = ", ".join(f"{engine} {value:.2f}" for engine, value in sorted(at8.items()))
                best = max(at8.values())
                section.rows.append((f"parallel efficiency at 8 nodes, {label} (equal CPU)", "0.81-0.88 (6.5-7.0x on 8)",
                                     efficiency, f"{best / 0.845:.2f}"))
    section.missing.append("the paper's 8 machines x 32 threads (two cores here: parallel efficiency at equal CPU stands in)")


def gba(section: Section, folder: Path) -> None:
    gba_scratch(section, folder)
    gba_switch(section, folder)


def gba_switch(section: Section, folder: Path) -> None:
    """The paper's own protocol (its Tables 6.1-6.4): continual training on time-ordered periods, every
    mode continuing from a sync-trained model, scored by the next period's AUC."""
    source = section.use("gba_stragglers_quota_switch.json", folder)
    if source is None:
        section.missing.append("the paper's switching protocol (sync's model continued by each mode, next-day AUC) "
                               "under CPU-quota stragglers")
        return
    data = source.data
    switch, runs = data["switch"], data["runs"]
    section.lines.append(f"Switching, the paper's protocol (its Tables 6.1-6.4): MovieLens-100k in {switch['periods']} "
                         f"time-ordered periods; sync trains periods {switch['sync_trained'][0]}-"
                         f"{switch['sync_trained'][1]}, then each mode continues from that model on periods "
                         f"{switch['switched'][0]}-{switch['switched'][1]} ({switch['epochs_per_period']} epochs each) "
                         f"with worker 0 slowed, scored by the AUC on the period after each; {len(data['seeds'])} seeds.")
    shorts, failed = [], []
    for sev, bars in data["bars_by_severity"].items():
        gap = data["by_severity"][sev]["gba_minus_sync_test_auc"]
        sync_auc = data["aggregates"]["sync"][sev]["test_auc"]["mean"]
        faster = bars["1_gba_2x_faster_than_sync"]
        over = bars["4_gba_test_auc_at_least_hop_bw"]["gba_minus_hop_bw_test_auc"]
        section.rows += [
            (f"after switching: next-period AUC, GBA - sync, straggler {sev} (mean, 95% interval)",
             "-0.0010 (Criteo, Table 6.1), +0.0000 / +0.0005 (Tables 6.2, 6.3)",
             f"{gap['mean']:+.4f} [{gap['ci95'][0]:+.4f}, {gap['ci95'][1]:+.4f}] ({100 * gap['mean'] / sync_auc:+.2f}%)", ""),
            (f"after switching: next-period AUC, GBA - hop_bw, straggler {sev}", "+0.0015 to +0.0033 (Tables 6.1-6.3)",
             f"{over['mean']:+.4f}", ""),
            (f"after switching: training seconds for the same periods, sync / GBA, straggler {sev}", ">= 2.4x",
             ", ".join(f"{ratio:.1f}x" for ratio in faster["per_seed_ratio"] if ratio is not None),
             "n/a" if faster["ratio_of_means"] is None else f"{faster['ratio_of_means']:.1f}x"),
        ]
        speed = "" if faster["ratio_of_means"] is None else f" at {faster['ratio_of_means']:.1f}x sync's speed"
        shorts.append(f"{gap['mean']:+.4f} AUC{speed} ({sev})")
        failed += [f"switching, {sev}: {bar['bar'].split(': ', 1)[1]}" for bar in bars.values() if not bar["passed"]]
    severity = "4x" if "4x" in data["bars_by_severity"] else next(iter(data["bars_by_severity"]), None)
    if severity is not None:
        periods = list(range(switch["switched"][0] + 1, switch["switched"][1] + 2))
        series = {}
        for mode in ("sync", "gba", "hop_bw", "async"):
            mine = [r["valid"] for r in runs if r["mode"] == mode and r["severity"] == severity]
            if mine and all(len(v) == len(periods) for v in mine):
                series[mode] = [round(sum(v[i]["auc"] for v in mine) / len(mine), 5) for i in range(len(periods))]
        section.figures.append(Figure("gba_switch_next_period_auc", f"After switching from sync, straggler {severity}",
                                      "period evaluated (trained on the one before)", "AUC (mean over seeds)",
                                      [str(p) for p in periods], series))
    if shorts:
        section.short = (section.short + "; " if section.short else "") + "switching from sync: " + ", ".join(shorts)
    if failed:
        section.missing.append("not met here: " + "; ".join(failed))


def gba_scratch(section: Section, folder: Path) -> None:
    source = section.use("gba_stragglers_quota.json", folder)
    if source is None:
        return
    data = source.data
    severities = list(data["by_severity"])
    section.lines.append(f"From scratch: DeepFM on MovieLens-100k, {len(data['seeds'])} seeds, {data['epochs']} epochs, 4 workers on "
                         "Ray, worker 0 slowed by a CPU-quota cgroup (1x-8x); target: each seed's best sync valid AUC "
                         f"less {data['target_margin']}.")
    times = {name: [(row.get(sev, {}).get("time_to_target") or {}).get("mean") for sev in severities]
             for name, row in data["aggregates"].items()}
    # the bars at each severity the file has them for (older files: 4x only, under ``bars``)
    by_severity = data.get("bars_by_severity") or {"4x": data["bars"]}
    shorts, failed = [], []
    for sev, bars in by_severity.items():
        gaps = data["by_severity"][sev]
        faster = bars["1_gba_2x_faster_than_sync"]
        reached = data["aggregates"]["gba"][sev].get("reached", "")
        per_seed = ", ".join("never" if ratio is None else f"{ratio:.1f}x" for ratio in faster["per_seed_ratio"])
        sync_auc = data["aggregates"]["sync"][sev]["test_auc"]["mean"]
        gap = gaps["gba_minus_sync_test_auc"]
        section.rows.append((f"from scratch: test AUC, GBA - sync, straggler {sev} (mean, 95% interval)", "within ~0.1% of sync",
                             f"{gap['mean']:+.4f} [{gap['ci95'][0]:+.4f}, {gap['ci95'][1]:+.4f}] "
                             f"({100 * gap['mean'] / sync_auc:+.2f}%)", ""))
        over = next((bar for bar in bars.values() if "gba_minus_hop_bw_test_auc" in bar), None)
        if over is not None:
            section.rows.append((f"from scratch: test AUC, GBA - hop_bw (backup workers), straggler {sev}",
                                 "GBA the best (+0.2% over the best baseline)",
                                 f"{over['gba_minus_hop_bw_test_auc']['mean']:+.4f}", ""))
        section.rows.append((f"from scratch: time to the target AUC, sync / GBA, straggler {sev}, per seed", ">= 2.4x",
                             f"{per_seed} (reached on {reached})",
                             "n/a" if faster["ratio_of_means"] is None else f"{faster['ratio_of_means']:.1f}x"))
        for name, key in (("iota 11", "gba_iota11_minus_sync_test_auc"), ("iota 2", "gba_iota2_minus_sync_test_auc")):
            if key in gaps:
                section.rows.append((f"the same GBA with {name}: test AUC - sync, straggler {sev}", "",
                                     f"{gaps[key]['mean']:+.4f}", ""))
        sooner = ("the target not on every seed" if faster["ratio_of_means"] is None
                  else f"{faster['ratio_of_means']:.1f}x sooner")
        shorts.append(f"{gap['mean']:+.4f} AUC, {sooner} at {sev}")
        failed += [f"from scratch, {sev}: {bar['bar'].split(': ', 1)[1]}" for bar in bars.values() if not bar["passed"]]
    for name in ("gba", "async"):
        counts = ", ".join(f"{sev} {data['aggregates'][name][sev].get('reached', '?')}" for sev in severities
                           if sev in data["aggregates"][name])
        section.rows.append((f"seeds on which {name} reached the target, by slowdown", "every seed", counts, ""))
    section.figures.append(Figure("gba_time_to_target", "Time to the target AUC with one slowed worker",
                                  "slowdown of worker 0 (CPU quota)", "seconds (mean over seeds that reached it)", severities,
                                  {name: [None if t is None else round(t, 3) for t in values]
                                   for name, values in times.items()}))
    section.short = "from scratch: " + "; ".join(shorts)
    if failed:
        section.missing.append("not met here: " + "; ".join(failed))


def pdasgd(section: Section, folder: Path) -> None:
    image = section.use("pdasgd.json", folder)
    if image is not None:
        bars, seeds = image.data["bars"], len(image.data["seeds"])
        section.lines.append(f"Fashion-MNIST, an MLP and a two-layer CNN, {seeds} seeds, one forward and two backward "
                             "threads on two cores (the paper: ResNets on CIFAR, one GPU).")
        for model, label in (("mlp", "MLP"), ("cnn", "CNN")):
            one, two = bars[f"{model}_speedup_vs_sync-1core"], bars[f"{model}_speedup_vs_sync"]
            lu = bars[f"{model}_lu_ge_bu"]
            section.rows += [
                (f"{label}: examples/s against one-core sequential backprop (accuracy gap)", "2.16x to accuracy",
                 f"{one['ratio']:.2f}x ({one['accuracy_gap']:+.4f})", f"{one['ratio'] / 2.16:.2f}"),
                (f"{label}: against two-core sync (its data-parallel stand-in)", "1.36x DDP to accuracy",
                 f"{two['ratio']:.2f}x ({two['accuracy_gap']:+.4f})", f"{two['ratio'] / 1.36:.2f}"),
                (f"{label}: accuracy, layer-wise - block updates (paired over seeds)", "+2.5 points (ResNet-50/C100)",
                 f"{100 * lu['paired']['mean']:+.2f} points", ""),
            ]
        section.short = (f"CNN {bars['cnn_speedup_vs_sync-1core']['ratio']:.2f}x one-core backprop, "
                         f"{bars['cnn_speedup_vs_sync']['ratio']:.2f}x two-core sync (examples/s)")
    timed = section.use("pdasgd_time_to_accuracy.json", folder)
    if timed is not None:
        pdasgd_time_and_delay(section, timed)
    timed_cnn = section.use("pdasgd_cnn_time_to_accuracy.json", folder)
    if timed_cnn is not None:
        pdasgd_time_and_delay(section, timed_cnn)
    delayed_cnn = section.use("pdasgd_delay_cnn.json", folder)
    if delayed_cnn is not None:
        pdasgd_time_and_delay(section, delayed_cnn)
    ctr = section.use("pdasgd_ctr.json", folder)
    if ctr is not None:
        bar = ctr.data["bars"]["ctr_auc_within_0.002"]
        section.rows.append(("DeepFM CTR: examples/s against sync (AUC difference)", "",
                             f"{bar['throughput_ratio']:.2f}x ({bar['difference']:+.4f})", ""))
    if timed is None:
        section.missing.append("time to a target accuracy (these are examples/s at equal epochs), and a slowed backward "
                               "thread (issue 49, item 4)")
    elif timed_cnn is None:
        section.missing.append("time to accuracy on the CNN (an epoch there costs ~20 s here: ~50 minutes for 3 seeds)"
                               + ("" if delayed_cnn is not None else ", and its delayed thread"))


def pdasgd_time_and_delay(section: Section, source: Source) -> None:
    """Seconds to sync's best validation accuracy, and a backward thread slowed by a CPU quota."""
    for part in source.data.get("image", []):
        reach, model = part["time_to_target"], part["model"].upper()
        seeds = sorted(reach["targets"], key=int)
        for name, ratios in reach["sync_over"].items():
            values = ", ".join("never" if ratios.get(seed) is None else f"{ratios[seed]:.2f}x" for seed in seeds
                               if seed in ratios)
            paper = {"pdasgd": "1.36x (DDP; two-core sync stands in)"}.get(name, "")
            section.rows.append((f"{model}: time to sync's best validation accuracy - {reach['margin']}, sync / {name} "
                                 "(per seed)", paper, values, ""))
    for part in source.data.get("delay", []):
        if "accuracy_minus_undelayed" not in part:
            continue
        speed = {name: row["examples_per_second"]["mean"] for name, row in part["summary"].items()}
        for name, difference in part["accuracy_minus_undelayed"].items():
            section.rows.append((f"{part['model'].upper()}: test accuracy, backward thread 0 slowed "
                                 f"{name.removeprefix('pdasgd-slow')} by a CPU quota, minus undelayed (paired; "
                                 "examples/s against undelayed)", "robust (no loss)",
                                 f"{100 * difference['mean']:+.2f} points ({speed[name] / speed['pdasgd']:.2f}x)", ""))


def shadowsync(section: Section, folder: Path) -> None:
    shadowsync_quality(section, folder)
    shadowsync_bmuf(section, folder)
    shadowsync_link(section, folder)
    capacity = section.use("shadowsync_capacity.json", folder)
    if capacity is None:
        return
    settings, summary = capacity.data["settings"], capacity.data["summary"]
    quotas = settings["quota_cores_per_server"]
    labels = ["no cap" if quota is None else f"{quota} core" for quota in quotas]
    section.lines.append(f"DLRM on a synthetic CTR stream, {settings['threads_per_trainer']} Hogwild threads a trainer, "
                         "the sync servers as Ray actors in CPU-quota cgroups.")
    series: dict[str, list[float | None]] = {}
    for trainers in settings["trainers"]:
        for name, label in (("shadow-easgd", "S-EASGD"), (f"fr-easgd-{settings['every']}", f"FR-EASGD-{settings['every']}")):
            values = []
            for quota in quotas:
                key = f"{trainers} trainers | {name} @ {'no quota' if quota is None else f'{quota} cores'} x1"
                row = summary.get(key) or next((v for k, v in summary.items()
                                                if k.startswith(f"{trainers} trainers | {name} @") and
                                                (("no quota" in k) if quota is None else (str(quota) in k))), None)
                values.append(round(row["eps_ratio_to_hogwild"]["mean"], 4) if row else None)
            series[f"{label}, {trainers} trainers"] = values
    section.figures.append(Figure("shadowsync_eps", "Examples/s against hogwild as the sync servers' CPU shrinks",
                                  "CPU quota per sync server", "EPS / hogwild's", labels, series,
                                  ("hogwild", 1.0)))
    capped = series.get(f"S-EASGD, {settings['trainers'][-1]} trainers", [None])[-1]
    fr_capped = series.get(f"FR-EASGD-{settings['every']}, {settings['trainers'][-1]} trainers", [None])[-1]
    section.rows += [
        (f"S-EASGD EPS / hogwild, servers at {quotas[-1]} core", "~1 (S-* scale with trainers)", fmt(capped), ""),
        (f"FR-EASGD-{settings['every']} EPS / hogwild, the same", "plateaus on its sync servers", fmt(fr_capped), ""),
    ]
    if not section.short:
        section.short = f"S-EASGD {fmt(capped)}x hogwild where FR-EASGD-{settings['every']} {fmt(fr_capped)}x (capped servers)"


def shadowsync_quality(section: Section, folder: Path) -> None:
    """Figure 5's quality panel: each shadow-* contender's eval logloss against the best FR-EASGD-k,
    paired by seed, and its examples/s against hogwild's."""
    source = section.use("shadowsync.json", folder)
    if source is None or "main" not in source.data:
        section.missing.append("Figure 5's eval loss, S-* against FR-EASGD-k over seeds")
        return
    main, seeds = source.data["main"], len(source.data["seeds"])
    section.lines.append(f"Figure 5's quality: DLRM on a synthetic CTR stream, one pass, 2 trainers x 2 Hogwild threads, "
                         f"{seeds} seeds, on threads (`@share`: the shadow thread looping freely at the paper's share "
                         "of a trainer's CPU, `shadow.cpu_share`).")
    for key, bar in main["bars"].items():
        if not key.startswith("b_") or "shadow_minus_best" not in bar:
            continue
        name = bar["bar"].split("'s eval logloss")[0]
        gap = bar["shadow_minus_best"]
        interval = f" [{gap['ci95'][0]:+.4f}, {gap['ci95'][1]:+.4f}]" if gap.get("ci95") else ""
        eps = main["summary"][name]["eps_ratio_to_hogwild"]
        section.rows.append((f"{name}: eval logloss - the best FR-EASGD-k ({bar['best_fr_easgd']}), paired; EPS / hogwild",
                             "the lowest of all (Fig. 5)" if "easgd" in name else "on par with FR-* (Fig. 6)",
                             f"{gap['mean']:+.4f}{interval}; {fmt(eps and eps['mean'])}x",
                             ""))


def shadowsync_bmuf(section: Section, folder: Path) -> None:
    """S-BMUF's block momentum and elastic parameter (its paper's Figure 7 ran a larger alpha): each
    variant's eval logloss against the best FR-EASGD-k of the same runs, paired by seed."""
    source = section.use("shadowsync_bmuf.json", folder)
    if source is None:
        return
    main, seeds = source.data["main"], len(source.data["seeds"])
    section.lines.append(f"S-BMUF's settings, the same runs, {seeds} seeds: block momentum "
                         "0.875 (fairseq's), 1 - 1/trainers (BMUF's paper), 0 (ShadowSync's Algorithm 4 as printed), "
                         "and twice the elastic parameter (the paper's Figure 7); beside each, the seeds on which it "
                         "ended more than 0.01 above hogwild's eval logloss (no sync at all).")
    runs = main["runs"]
    hogwild = {r["seed"]: r["eval_logloss"] for r in runs if r["contender"] == "hogwild" and r.get("eval_logloss")}
    for bar in main["bars"].values():
        gap = bar.get("shadow_minus_best")
        if gap is None:
            continue
        name = bar["bar"].split("'s eval logloss")[0]
        worse = sum(1 for r in runs if r["contender"] == name and r.get("eval_logloss") is not None
                    and r["seed"] in hogwild and r["eval_logloss"] > hogwild[r["seed"]] + 0.01)
        interval = f" [{gap['ci95'][0]:+.4f}, {gap['ci95'][1]:+.4f}]" if gap.get("ci95") else ""
        paper = ("the lowest of all (Fig. 5)" if "easgd" in name else "on par with FR-* (Fig. 6)" if name.startswith("fr-")
                 else "S-BMUF on par with S-EASGD; a larger alpha helps it (Fig. 7)")
        section.rows.append((f"{name}: eval logloss - {bar['best_fr_easgd']}, paired", paper,
                             f"{gap['mean']:+.4f}{interval}; worse than hogwild on {worse} of {seeds}", ""))


def shadowsync_link(section: Section, folder: Path) -> None:
    """Figure 5's scaling panel: examples/s against the trainer count, the sync servers behind a
    rate-limited link (the paper's cause of FR's plateau)."""
    source = section.use("shadowsync_link.json", folder)
    if source is None:
        section.missing.append("EPS against trainers with the sync servers behind a rate-limited link (issue 49, item 2)")
        return
    data = source.data
    settings, table = data["settings"], data["summary"]
    trainers = [str(count) for count in settings["trainers"]]
    section.lines.append(f"Figure 5's scaling: the sync servers in a network namespace behind a `tc tbf` link of "
                         f"{settings['rate']} each way (a Ray node of their own), {settings['worker_threads']} Hogwild "
                         f"threads a trainer, {len(data['seeds'])} seeds.")
    series = {name: [None if not (rows.get(t) or {}).get("eps_ratio_to_hogwild") else
                     round(rows[t]["eps_ratio_to_hogwild"]["mean"], 4) for t in trainers]
              for name, rows in table.items() if name != "hogwild"}
    section.figures.append(Figure("shadowsync_link", "Examples/s against hogwild, sync servers behind a slow link",
                                  "trainers", "EPS / hogwild's", trainers, series, ("hogwild", 1.0)))
    for name in ("shadow-easgd", "shadow-easgd@share", "fr-easgd-5"):
        if name in series:
            gaps = [(table[name].get(t) or {}).get("sync_gap") for t in trainers]
            section.rows.append((f"{name} EPS / hogwild at {', '.join(trainers)} trainers (sync gap)",
                                 "S-EASGD linear; FR-EASGD-5 plateaus" if name != "fr-easgd-5" else "plateaus",
                                 ", ".join(f"{fmt(v)}" + (f" ({g['mean']:.1f})" if g else "")
                                           for v, g in zip(series[name], gaps)), ""))
    shadows = [v for name in ("shadow-easgd", "shadow-easgd@share") for v in series.get(name, []) if v is not None]
    fr = series.get("fr-easgd-5", [])
    section.short = (f"behind a link of {settings['rate']}: S-EASGD >= {fmt(min(shadows) if shadows else None)}x hogwild, "
                     f"FR-EASGD-5 {fmt(fr[0] if fr else None)} -> {fmt(fr[-1] if fr else None)}x")
    failed = [bar["bar"] for bar in data["bars"].values() if not bar["passed"]]
    if failed:
        section.missing.append("not met here: " + "; ".join(failed))


SECTIONS: list[tuple[str, str, str, Callable[[Section, Path], None]]] = [  # title, claim, headline, render
    ("OAC: sync's model at async's speed (seed 000)",
     "Freebase86m, DistMult d50, one V100: OAC finishes 10 epochs as fast as async (~6,500 s; sync ~12,500 s) "
     "and matches sync's MRR (0.73); up to 3x faster than sync to the same accuracy.",
     "sync's MRR at async's time per epoch", oac),
    ("AdaPM: intent-driven relocation and replication (seed 001)",
     "8 nodes x 32 threads: 6.5-7.0x effective speed-up over one efficient node; relocation cuts communication "
     "to 0.11x replication-only's (Table 2).",
     "6.5-7x on 8 nodes; 0.11x replication's bytes", adapm),
    ("GBA: the sync global batch, asynchronously (seed 002)",
     "Switching sync <-> GBA needs no retuning; with stragglers GBA runs at async's speed (>= 2.4x sync) with AUC "
     "within ~0.1% of sync's.",
     "sync's AUC at >= 2.4x its speed with stragglers", gba),
    ("pdASGD: forward and backward in separate threads (seed 003)",
     "Up to ~2x data-parallel's time to accuracy on CIFAR (1.36x DDP, 2.16x single-device SGD); layer-wise updates "
     "beat block updates (ResNet-50/C100 76.2% vs 73.7%).",
     "1.36x DDP, 2.16x one-device SGD to accuracy", pdasgd),
    ("ShadowSync: dense replicas synced in the background (seed 004)",
     "S-EASGD's eval loss at or below every FR-EASGD-k; S-* examples/s scale with trainers while FR-* plateau on "
     "their sync servers (Figure 5).",
     "S-EASGD's loss <= FR-EASGD-k; S-* keep scaling", shadowsync),
]


def build(folder: Path = RESULTS) -> list[Section]:
    sections = []
    for title, claim, headline, render in SECTIONS:
        section = Section(title, claim, headline)
        render(section, folder)
        sections.append(section)
    return sections


def page(sections: list[Section]) -> str:
    out = ["# Results: each paper's headline, and cadence's figure", "",
           "Generated by `make results` (`benchmarks/results_page.py`) from `benchmarks/results/*.json`; "
           "a test fails where this page differs from them. A result file from an uncommitted tree is refused "
           "and named, never quoted. How to reproduce each figure: `docs/benchmarks.md`.", ""]
    for section in sections:
        out += [f"## {section.title}", "", f"**The paper:** {section.claim}", ""]
        out += section.lines + ([""] if section.lines else [])
        if section.rows:
            out += ["| measure | paper | cadence | cadence / paper |", "|---|---|---|---|"]
            out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in section.rows]
            out.append("")
        for figure in section.figures:
            out += [f"![{figure.title}](results/{figure.name}.svg)", f"<!-- figure data sha256: {figure.digest()} -->", ""]
        for source in section.sources:
            out.append(f"- From {source.cite()}: `{source.data.get('command', '(command not recorded)')}`")
        for refused in section.refused:
            out.append(f"- Not quoted: `benchmarks/results/{refused.name}`: {refused.why}.")
        for gap in section.missing:
            out.append(f"- Not shown yet: {gap}.")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def readme_table(sections: list[Section]) -> str:
    rows = ["| paper | its headline | cadence today (`docs/results.md`) |", "|---|---|---|"]
    for section in sections:
        name = section.title.split(":")[0]
        anchor = section.title.lower().replace(" ", "-")
        anchor = "".join(ch for ch in anchor if ch.isalnum() or ch == "-")
        rows.append(f"| {name} | {section.headline} | "
                    f"[{section.short or 'no clean result yet'}](docs/results.md#{anchor}) |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write docs/results.md, its figures and the README's table")
    args = parser.parse_args()
    sections = build()
    text = page(sections)
    if not args.write:
        print(text)
        return 0
    PAGE.write_text(text)
    for section in sections:
        for figure in section.figures:
            figure.draw(FIGURES)
    doc_tables.emit(readme_table(sections), True, README_BLOCK, SCRIPT, README)
    print(f"wrote {PAGE.relative_to(REPO)}, {sum(len(s.figures) for s in sections)} figures, the README's table",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
