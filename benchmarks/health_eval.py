"""Does the trained node-health model find unhealthy storage nodes better than the threshold? (issue 31) On real faults
in a real examples/cluster, under a steady load. Not part of CI; needs /dev/fuse, pyfuse3, a cgroup cpu controller
and root (benchmarks/faults.py), and pyspark for the training job.

    PYTHONPATH=. python benchmarks/health_eval.py --quick      # 2 s windows, one severity per kind: under 5 min
    PYTHONPATH=. python benchmarks/health_eval.py              # 5 s windows, three severities per kind: ~40 min

What it does, in the order it runs:

1. Cluster. examples/cluster/cluster.sh starts 3 nameservers, storage1..3 and 2 brokers in a fresh BASE under /tmp,
   every storage node prepared by faults.py (data dir on slowfs, inbound links behind the fault proxy), the nodes
   running this tree's rocket (PYTHONPATH; checked in each node's /proc environment), with ROCKET_HEALTH_WINDOW_S
   and ROCKET_TELEMETRY_INTERVAL_S set to the mode's window. `health_eval.py produce` sends a steady load through
   both brokers (senders per broker, a batch of keyed messages each tick, over 16 queues and so every storage
   group): every node leads groups, fsyncs and is called each window (result.json's "load" says how much).
2. Faults. A TRAIN schedule, then a TEST one, of episodes: a fault for --fault-s on one storage node, then --gap-s
   with none (a degraded node needs 6 healthy windows to return, and fewer than half the nodes may be degraded at
   once, so the gap is longer than a recovery). Kinds and severities: slow_disk (fsync factor 2, 5, 20), link (loss
   1%, 5%, 20%: faults.py run --loss), cpu (1/2, 1/4, 1/8 of a CPU), and control runs (no fault); --quick takes the
   middle severity. The schedules pair kinds with nodes differently: a kind's fault at a severity hits another node
   in TEST than in TRAIN (--train-runs N: N TRAIN schedules, alternating two pairings, neither TEST's). Labels go to
   BASE/train.jsonl and BASE/test.jsonl. Then the load stops, the cluster stops (each node ships its telemetry on
   the way out) and faults.py tears down.
3. Training. `python -m jobs.train_health` --labels train, --test-labels test, models to BASE/models (one function,
   train_model; without the job in this tree the model is the default ThresholdScorer), on a copy of the telemetry's
   window records without the TEST schedule's gaps (the job would train on them; they are scored here).
4. Scoring, offline: the judged windows the nameserver leader noted in its telemetry (read from the object store,
   and from any spool file a node left), those of the TEST schedule in time order, through each scorer (the model;
   the threshold with the parameters the job tuned) and a HealthJudge (3 unhealthy windows degrade, 6 healthy ones
   return, the minority cap). Per scorer: per kind precision, recall and F1 of windows (truth: jobs.health_data.
   window_label, windows straddling a fault's edge left out; a window predicted as a kind is Verdict.kind), overall
   F1 (unhealthy against healthy); detection latency p50/p99 per kind (the node's degradation minus the fault's
   start, for faults detected before their end plus one window; the others are misses); false degradations per
   node-hour (a node degraded outside any fault of its own, other than late detection) on the control runs and
   over the whole schedule.
5. benchmarks/results/health_eval{,_quick}/result.json and health_eval.png (an SVG without matplotlib); the last line
   printed is `health: F1 model=X threshold=Y`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import faults  # noqa: E402
from health_metrics import STORAGE, STORAGE_IDS, Judgement, evaluate, judgements, percentile  # noqa: E402
from jobs.health_data import Label, is_window_record, read_labels  # noqa: E402
from rocket.ml.health import KINDS, HealthModel, ModelScorer, Scorer, ThresholdScorer  # noqa: E402

CLUSTER_SH = ROOT / "examples/cluster/cluster.sh"
NAMESERVERS = ("ns1", "ns2", "ns3")
BROKERS = ("broker1", "broker2")
HEALTH_MODEL_KEY = "models/health/latest.json"  # where jobs.train_health puts the model (the nameserver reads it)
TOPIC, QUEUES = "health-load", 16
PORT_BASES = range(9600, 12000, 100)  # the first whose ports are all free is used
TRAIN_TIMEOUT_S = 900.0


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    window_s: float  # ROCKET_HEALTH_WINDOW_S, and the telemetry interval
    fault_s: float
    gap_s: float  # after a fault: longer than a recovery (6 windows) and a window or two
    control_gap_s: float
    warmup_s: float  # after the load starts: leaders settle and the first windows are judged
    severities: dict  # kind -> severities, mildest first
    train_runs: int = 1  # TRAIN schedules, one after the other: each kind and severity this many times


FULL = Mode("full", 5.0, 60.0, 45.0, 5.0, 30.0, {"slow_disk": (2, 5, 20), "link": (1, 5, 20), "cpu": (2, 4, 8)})
QUICK = Mode("quick", 2.0, 12.0, 15.0, 2.0, 4.0, {"slow_disk": (5,), "link": (5,), "cpu": (4,)})


@dataclasses.dataclass(frozen=True)
class Episode:
    kind: str  # of KINDS, or "control"
    node: str
    severity: float
    fault_s: float
    gap_s: float

    @property
    def loss(self) -> bool:
        return self.kind == "link"  # link faults are losses here; faults.py run --kind link alone adds latency


def schedule(mode: Mode, shift: int) -> list[Episode]:
    """Per severity level: a control run, then one fault of each kind, each kind on node (kind + level + shift) mod 3:
    shifts 0 and 2 are TRAIN's, 1 is TEST's, so a kind at a severity hits another node in each."""
    levels = len(next(iter(mode.severities.values())))
    episodes = []
    for level in range(levels):
        episodes.append(Episode("control", STORAGE[(level + shift) % 3], 0, mode.fault_s, mode.control_gap_s))
        for index, kind in enumerate(KINDS):
            node = STORAGE[(index + level + shift) % 3]
            episodes.append(Episode(kind, node, mode.severities[kind][level], mode.fault_s, mode.gap_s))
    return episodes


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the cluster ---------------------------------------------------------------------------------------------------

def port_base_free(base: int) -> bool:
    """Every port the cluster, its HTTP/2 listeners and the proxies would take is free on 127.0.0.1."""
    import socket

    offsets = [*faults.NODE_IDS.values(), 31, 32, *(node + faults.PROXY_PORT_OFFSET for node in STORAGE_IDS)]
    for offset in offsets:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + offset))
            except OSError:
                return False
    return True


def cluster_environment(mode: Mode, port_base: int) -> dict:
    """The nodes run this tree's rocket, judge health every window and sample telemetry as often."""
    path = os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    return {**os.environ, "PYTHONPATH": path, "PORT_BASE": str(port_base), "ROCKET_BIN": f"{sys.executable} -m rocket",
            "ROCKET_HEALTH_WINDOW_S": str(mode.window_s), "ROCKET_TELEMETRY_INTERVAL_S": str(mode.window_s),
            "START_TIMEOUT_S": "120"}


def cluster_sh(command: str, rc: Path, environment: dict, log_path: Path) -> None:
    with open(log_path, "a") as output:
        completed = subprocess.run([str(CLUSTER_SH), command, str(rc)], env=environment, stdout=output,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if completed.returncode != 0:
        raise RuntimeError(f"cluster.sh {command} failed ({completed.returncode}); see {log_path}")


def check_tree(rc: Path) -> None:
    """Each node runs `python -m rocket` with this tree first on its PYTHONPATH, not an installed rocket."""
    for name in faults.NODE_IDS:
        pid = faults.node_pid(rc, name)
        if pid is None:
            raise RuntimeError(f"{name} is not running")
        environ = dict(entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0")
                       if "=" in entry)
        first = environ.get("PYTHONPATH", "").split(os.pathsep)[0]
        if Path(first).resolve() != ROOT:
            raise RuntimeError(f"{name} (pid {pid}) has PYTHONPATH {environ.get('PYTHONPATH')!r}, not {ROOT} first")


def start_load(base: Path, port_base: int) -> subprocess.Popen:
    servers = [f"127.0.0.1:{port_base + faults.NODE_IDS[name]}" for name in BROKERS]
    output = open(base / "produce.log", "ab")
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "produce", "--servers", ",".join(servers)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT)


def stop_load(process: subprocess.Popen | None) -> None:
    """SIGTERM ends it at once (a load generator has nothing to flush: what it sent is acknowledged or not)."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_schedule(rc: Path, episodes: list[Episode], labels: Path, load: subprocess.Popen) -> list[dict]:
    """Each episode's fault (faults.run appends its label), then its gap; (start, end) of the whole in ms."""
    done = []
    for number, episode in enumerate(episodes, 1):
        if load.poll() is not None:
            raise RuntimeError(f"the load generator exited ({load.returncode}); see produce.log")
        log(f"{labels.stem} {number}/{len(episodes)}: {episode.kind} on {episode.node}, severity {episode.severity}, "
            f"{episode.fault_s:g} s, then {episode.gap_s:g} s clear")
        label = faults.run(rc, episode.node, episode.kind, episode.severity, 0, episode.fault_s, labels, episode.loss)
        done.append(label)
        time.sleep(episode.gap_s)
    return done


def window_records(rc: Path) -> list[dict]:
    """Every judged-window record the nameservers noted: shipped to the cluster's object store, or left in a spool
    (a node killed before it shipped)."""
    import fastavro
    from jobs.spark import decode_object

    records = []
    for path in sorted((rc / "tier" / "telemetry").rglob("*.avro")):
        _, samples, why = decode_object(str(path), path.read_bytes())
        if samples is None:
            log(f"telemetry: skipping {path}: {why}")
        records.extend(samples or ())
    for name in NAMESERVERS:
        for path in sorted((rc / name / "data" / "telemetry").glob("*.avro*")):
            try:
                with open(path, "rb") as file:
                    records.extend(fastavro.reader(file))
            except Exception as error:  # noqa: BLE001 - a torn spool file: its complete records were shipped or lost
                log(f"telemetry: skipping spool file {path}: {error}")
    return [record for record in records if is_window_record(record)]


# ---- training: the one step that knows the job -----------------------------------------------------------------

@dataclasses.dataclass
class Trained:
    model: HealthModel | None
    threshold_params: dict
    note: str
    seconds: float = 0.0


def job_telemetry(records: list[dict], spans: dict, test_labels: list[Label], root: Path) -> Path:
    """The window records the job may see, as telemetry objects under root (each reporter's as one spool file,
    shipped by rocket's own spool and shipper): those of the TRAIN schedule, and of the TEST schedule only those
    inside its fault runs, which the job holds out. The TEST schedule's gaps would otherwise be training windows,
    and the scores below, taken over the whole TEST schedule, would count windows the model was fitted on."""
    import trio

    from rocket.telemetry.ship import ship_once
    from rocket.telemetry.spool import Spool
    from rocket.tier.local import LocalDirectoryStore

    def wanted(record: dict) -> bool:
        time_ms = record["time_ms"]
        return time_ms < spans["test"][0] or any(label.start_ms <= time_ms <= label.end_ms for label in test_labels)

    by_reporter: dict[int, list[dict]] = {}
    for record in filter(wanted, records):
        by_reporter.setdefault(record["node"], []).append(record)

    async def ship() -> None:
        async with LocalDirectoryStore(root) as store:
            for reporter, mine in by_reporter.items():
                spool = Spool(root.parent / f"spool-{reporter}")
                spool.append(sorted(mine, key=lambda record: record["time_ms"]))
                spool.rotate()
                await ship_once(spool, store, reporter)

    trio.run(ship)
    return root


def read_model(models: Path) -> str:
    """models/health/latest.json from a LocalDirectoryStore root (its footer checked and stripped)."""
    import trio

    from rocket.tier.local import LocalDirectoryStore

    async def get() -> bytes:
        async with LocalDirectoryStore(models) as store:
            return await store.get(HEALTH_MODEL_KEY)

    return trio.run(get).decode()


def train_model(telemetry: Path, train_labels: Path, test_labels: Path, models: Path, master: str,
                log_path: Path) -> Trained:
    """jobs.train_health on the telemetry and labels; the model it put under models, and the threshold parameters
    it tuned. Without the job in this tree: no model, the default threshold."""
    if not (ROOT / "jobs" / "train_health.py").exists():
        return Trained(None, {}, "jobs/train_health.py is not in this tree: the default ThresholdScorer stands in")
    started = time.monotonic()
    command = [sys.executable, "-m", "jobs.train_health", "--telemetry", str(telemetry), "--labels", str(train_labels),
               "--test-labels", str(test_labels), "--models", str(models), "--master", master]
    with open(log_path, "ab") as output:
        completed = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                   stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                   timeout=TRAIN_TIMEOUT_S)
    if completed.returncode != 0:
        raise RuntimeError(f"jobs.train_health failed ({completed.returncode}); see {log_path}")
    model = HealthModel.from_json(read_model(models))
    return Trained(model, dict(model.metrics.get("threshold_params") or {}), f"model {model.version}",
                   time.monotonic() - started)


def scorers(trained: Trained) -> dict[str, Scorer]:
    threshold = ThresholdScorer(**trained.threshold_params)
    return {"model": ModelScorer(trained.model) if trained.model else ThresholdScorer(), "threshold": threshold}


# ---- the report ----------------------------------------------------------------------------------------------------

def load_figures(judged: list[Judgement]) -> dict:
    """Per node, the median fsyncs and calls per window: whether the load gave every window enough to judge."""
    figures = {}
    for node in STORAGE_IDS:
        mine = [window for judgement in judged for window in judgement.windows if window.node == node]
        figures[str(node)] = {"windows": len(mine), "fsyncs_median": percentile([w.fsyncs for w in mine], 0.5),
                              "calls_median": percentile([w.calls for w in mine], 0.5),
                              "fsyncs_min": min((w.fsyncs for w in mine), default=None)}
    return figures


def chart(path: Path, results: dict, labels: list[Label], span_ms: tuple[int, int]) -> Path:
    """F1 per kind and scorer, and the TEST schedule's faults with each scorer's degradations; an SVG of the first
    panel where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return svg_chart(path.with_suffix(".svg"), results)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, timeline) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    groups = [*KINDS, "overall"]
    width = 0.8 / len(results)
    for index, (name, figures) in enumerate(results.items()):
        values = [figures["windows"]["kinds"][kind]["f1"] for kind in KINDS] + [figures["windows"]["f1"]]
        bars.bar([position + index * width for position in range(len(groups))], values, width, label=name)
    bars.set_xticks([position + width * (len(results) - 1) / 2 for position in range(len(groups))], groups)
    bars.set_ylim(0, 1)
    bars.set_ylabel("F1 of windows (TEST schedule)")
    bars.legend(fontsize=8)
    colours = {"slow_disk": "tab:orange", "link": "tab:purple", "cpu": "tab:red", "control": "lightgrey"}
    for label in labels:  # a control run concerns every node: none is under a fault
        row, height = (-0.4, len(STORAGE) - 0.2) if label.kind == "control" else (STORAGE_IDS.index(label.node_id)
                                                                                 - 0.4, 0.8)
        timeline.broken_barh([((label.start_ms - span_ms[0]) / 1000, (label.end_ms - label.start_ms) / 1000)],
                             (row, height), color=colours[label.kind], alpha=0.5)
    for index, (name, figures) in enumerate(results.items()):
        offset, colour = -0.2 + 0.4 * index, "black" if index == 0 else "tab:blue"
        unhealthy = figures["unhealthy_windows"]
        timeline.scatter([(at_ms - span_ms[0]) / 1000 for at_ms, _, _ in unhealthy],
                         [STORAGE_IDS.index(node) + offset for _, node, _ in unhealthy], marker="|", s=40,
                         color=colour, label=f"{name}: unhealthy window", zorder=3)
        degrades = figures["degrades"]
        timeline.scatter([(each["at_ms"] - span_ms[0]) / 1000 for each in degrades],
                         [STORAGE_IDS.index(each["node"]) + offset for each in degrades], marker="v^"[index % 2],
                         s=60, color=colour, label=f"{name}: degrades", zorder=4)
    for kind, colour in colours.items():
        timeline.bar(0, 0, color=colour, label=kind)
    timeline.set_yticks(range(len(STORAGE)), STORAGE)
    timeline.set_xlabel("seconds into the TEST schedule")
    timeline.set_ylim(-0.6, len(STORAGE) - 0.4)
    timeline.set_xlim(0, (span_ms[1] - span_ms[0]) / 1000)
    timeline.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def svg_chart(path: Path, results: dict) -> Path:
    groups = [*KINDS, "overall"]
    colours = ["#444", "#4a8ad4", "#d4894a"]
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="520" height="260" font-family="sans-serif" '
             'font-size="11">', '<text x="10" y="16">F1 of windows (TEST schedule)</text>']
    for group_index, group in enumerate(groups):
        x = 40 + group_index * 120
        parts.append(f'<text x="{x}" y="250">{group}</text>')
        for index, figures in enumerate(results.values()):
            value = figures["windows"]["f1"] if group == "overall" else figures["windows"]["kinds"][group]["f1"]
            height = 200 * value
            parts.append(f'<rect x="{x + index * 30}" y="{230 - height:.0f}" width="26" height="{height:.0f}" '
                         f'fill="{colours[index % 3]}"/>')
    for index, name in enumerate(results):
        parts.append(f'<text x="{300 + index * 100}" y="16" fill="{colours[index % 3]}">{name}</text>')
    path.write_text("\n".join(parts + ["</svg>"]) + "\n")
    return path


def print_figures(results: dict) -> None:
    for name, figures in results.items():
        windows_, detection = figures["windows"], figures["detection"]
        print(f"{name} ({figures['scorer']}): {windows_['windows']} windows {windows_['truth']}; unhealthy vs healthy: "
              f"precision {windows_['precision']:.2f} recall {windows_['recall']:.2f} F1 {windows_['f1']:.2f}")
        for kind in KINDS:
            kind_windows, kind_detection = windows_["kinds"][kind], detection["kinds"][kind]
            p50, p99 = kind_detection["latency_p50_s"], kind_detection["latency_p99_s"]
            latency = f"{p50:.1f}/{p99:.1f} s" if p50 is not None else "-"
            print(f"  {kind:9} precision {kind_windows['precision']:.2f} recall {kind_windows['recall']:.2f} "
                  f"F1 {kind_windows['f1']:.2f}; detected {kind_detection['detected']}, missed "
                  f"{kind_detection['missed']}, latency p50/p99 {latency}")
        rates = figures["false_degradations_per_node_hour"]
        print(f"  false degradations: {rates['control_false']} on control runs ({rates['control']:.1f}/node-hour), "
              f"{rates['overall_false']} in all ({rates['overall']:.1f}/node-hour); late detections "
              f"{len(detection['late'])}")


# ---- main ----------------------------------------------------------------------------------------------------------

def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s windows, the middle severity of each kind")
    parser.add_argument("--out", default="", help="default: benchmarks/results/health_eval{,_quick}")
    parser.add_argument("--fault-s", type=float, default=None, help="seconds of each fault (default: the mode's)")
    parser.add_argument("--gap-s", type=float, default=None, help="seconds clear after each fault (the mode's)")
    parser.add_argument("--train-runs", type=int, default=1, help="TRAIN schedules: each kind and severity this "
                        "many times, the runs pairing kinds with nodes in turn as TEST never does (default 1)")
    parser.add_argument("--master", default="local[2]", help="the training job's Spark master")
    parser.add_argument("--keep", action="store_true", help="keep BASE (the cluster's data, logs, labels)")
    parser.add_argument("--from-base", default="", help="a BASE kept by --keep: train and score its run again, "
                        "without a cluster")
    return parser.parse_args(argv)


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_cluster(mode: Mode, base: Path) -> dict:
    """Steps 1 and 2: the cluster up, the load, both schedules, and everything stopped and torn down again, also
    on errors; the labels' paths and the schedules' spans."""
    rc = base / "rc"
    port_base = next((each for each in PORT_BASES if port_base_free(each)), None)
    if port_base is None:
        raise RuntimeError(f"no free PORT_BASE in {PORT_BASES}")
    environment = cluster_environment(mode, port_base)
    load = None
    spans = {}
    try:
        for name in STORAGE:
            faults.prepare(rc, name, slow_disk=True, proxy=True, port_base=port_base)
        log(f"starting the cluster in {rc} (PORT_BASE={port_base}, {mode.window_s:g} s windows)")
        cluster_sh("start", rc, environment, base / "cluster.log")
        check_tree(rc)
        load = start_load(base, port_base)
        time.sleep(mode.warmup_s)
        train_shifts = [(0, 2)[run % 2] for run in range(mode.train_runs)]  # TEST's pairing (1) is never trained on
        for schedule_name, shifts in (("train", train_shifts), ("test", [1])):
            started_ms = faults.now_ms()
            for shift in shifts:
                run_schedule(rc, schedule(mode, shift), base / f"{schedule_name}.jsonl", load)
            spans[schedule_name] = (started_ms, faults.now_ms())
        (base / "spans.json").write_text(json.dumps(spans))
    finally:
        log("stopping the load and the cluster, tearing the faults down")
        stop_load(load)
        if (rc / "port_base").exists():
            cluster_sh("stop", rc, environment, base / "cluster.log")
        faults.teardown(rc)
        log("stopped")
    return spans


def main(argv=None) -> None:
    arguments = parse(argv)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, interrupt)
    mode = QUICK if arguments.quick else FULL
    mode = dataclasses.replace(mode, fault_s=arguments.fault_s or mode.fault_s, gap_s=arguments.gap_s or mode.gap_s,
                               train_runs=arguments.train_runs)
    out = Path(arguments.out or ROOT / "benchmarks/results" / ("health_eval_quick" if arguments.quick else "health_eval"))
    out.mkdir(parents=True, exist_ok=True)
    base = Path(arguments.from_base or tempfile.mkdtemp(prefix="health-eval-", dir="/tmp"))
    timings = {}
    try:
        if arguments.from_base:
            spans = {name: tuple(span) for name, span in json.loads((base / "spans.json").read_text()).items()}
        else:
            spans = run_cluster(mode, base)
        timings["cluster_s"] = time.monotonic() - started
        records = window_records(base / "rc")
        test_labels = read_labels(base / "test.jsonl")
        log(f"{len(records):,} window records read")
        mark = time.monotonic()
        for stale in ("models", "job"):  # a --from-base run's earlier ones
            shutil.rmtree(base / stale, ignore_errors=True)
        telemetry = job_telemetry(records, spans, test_labels, base / "job" / "tier")
        trained = train_model(telemetry, base / "train.jsonl", base / "test.jsonl", base / "models",
                              arguments.master, base / "train.log")
        timings["train_s"] = time.monotonic() - mark
        log(f"training: {trained.note}")
        judged_all = judgements(records)
        test_span = spans["test"]
        judged = [each for each in judged_all if test_span[0] <= each.at_ms <= test_span[1]]
        results = {name: evaluate(scorer, judged, test_labels, mode.window_s, test_span)
                   for name, scorer in scorers(trained).items()}
        chart_path = chart(out / "health_eval.png", results, test_labels, test_span)
        timings["total_s"] = time.monotonic() - started
        report = {"mode": dataclasses.asdict(mode), "wall_s": round(timings["total_s"], 1),
                  "rescored_from_base": bool(arguments.from_base),
                  "timings_s": {key: round(value, 1) for key, value in timings.items()},
                  "model_version": trained.model.version if trained.model else None, "training": trained.note,
                  "threshold_params": trained.threshold_params,
                  "model_metrics": trained.model.metrics if trained.model else None,
                  "judgements": {"all": len(judged_all), "test": len(judged),
                                 "reporters": dict(Counter(str(each.reporter) for each in judged_all))},
                  "load": load_figures(judged), "spans_ms": spans,
                  "labels": {name: [json.loads(line) for line in (base / f"{name}.jsonl").read_text().splitlines()]
                             for name in ("train", "test")},
                  "scorers": results, "chart": chart_path.name}
        (out / "result.json").write_text(json.dumps(report, indent=1))
    finally:
        if arguments.keep or arguments.from_base or any(faults.is_slowfs_mount(base / "rc" / name / "data") for name in STORAGE):
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print_figures(results)
    print(f"({timings['total_s']:.0f} s in all: cluster and faults {timings['cluster_s']:.0f} s, training "
          f"{timings['train_s']:.0f} s; JSON and chart in {out})")
    print(f"health: F1 model={results['model']['windows']['f1']:.2f} threshold={results['threshold']['windows']['f1']:.2f}")


# ---- the load: `health_eval.py produce` ------------------------------------------------------------------------

async def produce(servers: list[str], senders: int, messages: int, tick_s: float, size: int) -> None:
    """Steady keyed batches through every broker until interrupted; a count every 10 s."""
    import trio

    from rocket.client import Admin, connect
    from rocket.errors import Code, RocketError

    async with connect(servers[0]) as channel:
        try:
            await Admin(channel).create_topic(TOPIC, QUEUES)
        except RocketError as error:
            if error.code != Code.TOPIC_EXISTS:
                raise
    counts = Counter()
    async with trio.open_nursery() as nursery:
        for server in servers:
            for number in range(senders):
                nursery.start_soon(send_steadily, server, random.Random(f"{server}/{number}"), messages, tick_s, size,
                                   counts)
        while True:
            await trio.sleep(10)
            print(f"{time.strftime('%H:%M:%S')} sent {counts['sent']:,} messages, {counts['failed']:,} failed",
                  flush=True)


async def send_steadily(server: str, chooser: random.Random, messages: int, tick_s: float, size: int,
                        counts: Counter) -> None:
    import trio

    from rocket.client import connect, open_producer
    from rocket.errors import RocketError
    from rocket.model import Message

    body = b"h" * size
    while True:  # a connection lost (a reset link, a node restarted) is opened again
        try:
            async with connect(server) as channel, open_producer(channel, TOPIC) as producer:
                next_tick = trio.current_time()
                while True:
                    batch = [Message(body, key=f"k{chooser.randrange(1 << 30)}") for _ in range(messages)]
                    try:
                        await producer.send_many(batch)
                        counts["sent"] += messages
                    except RocketError:
                        counts["failed"] += messages  # a leader change or a faulty node: the load goes on
                    next_tick += tick_s
                    await trio.sleep_until(max(next_tick, trio.current_time()))
        except (RocketError, OSError, trio.BrokenResourceError):
            counts["failed"] += messages
            await trio.sleep(tick_s)


def produce_main(argv: list[str]) -> None:
    import trio

    parser = argparse.ArgumentParser(description="the steady load of health_eval.py")
    parser.add_argument("--servers", required=True, help="brokers, comma-separated: each gets --senders senders")
    parser.add_argument("--senders", type=int, default=3)
    parser.add_argument("--messages", type=int, default=12, help="per batch of random keys, so over several queues")
    parser.add_argument("--tick-s", type=float, default=0.1)
    parser.add_argument("--size", type=int, default=256)
    arguments = parser.parse_args(argv)
    try:
        trio.run(produce, arguments.servers.split(","), arguments.senders, arguments.messages, arguments.tick_s,
                 arguments.size)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        produce_main(sys.argv[2:])
    else:
        main()
