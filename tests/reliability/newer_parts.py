"""The reliability corpus, part two (issue 29): what a user can get wrong with the parts added after
the first corpus: the ``shadow-*``, ``fr-*``, ``hogwild``, ``pdasgd*`` and ``adapm`` strategies,
their config sections, the ``image`` task, and ``--engine ray`` with them.

Six categories:

- ``unread_keys``: a key the chosen strategy, model, optimizer or schedule does not read (another
  one does) is refused with one line naming the key and who reads it;
- ``edge_values``: zero, huge, tiny and non-finite settings, malformed image files: one line naming
  the setting or file and the allowed range, before anything is written;
- ``hangs``: settings that could make a run wait for ever end it (trained, or one line), in bounded time;
- ``empty_splits``: no metric is made up from an empty split (an error naming the file, or the metric
  absent), and a split too small for a strategy's workers is refused;
- ``resources``: counts and sizes that would exhaust memory or threads, and decompression bombs:
  one line naming the setting (or file) and what it would need;
- ``ray_strategies``: the new strategies on Ray, killed or interrupted from outside: one line (or a
  documented recovery), never an ``ActorDiedError`` traceback.

Registered into ``cases.CASES`` (``tests.reliability.corpus`` imports both parts).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import struct
import time
import zlib
from pathlib import Path

from tests.reliability.cases import case
from tests.reliability.harness import Result, Workspace, interrupt_when, train_args

HANG_LIMIT = 90.0  # seconds a case of ``hangs`` may take to end the run, one way or the other


def _guarded(*parts) -> float | None:
    """A real process with a time limit where a setting's mistake could hang it (a background
    thread's wait, a loop over a rate); in this process otherwise."""
    text = " ".join(str(item) for part in parts for item in (part if isinstance(part, list) else [part]))
    return HANG_LIMIT if any(word in text for word in ("adapm", "shadow", "fr-", "pdasgd", "stall")) else None


def _refused(ws: Workspace, result: Result, *mentions: str) -> str:
    line = ws.fails(result, *mentions)
    ws.absent(ws.root / "run")
    return line


# ==== 10. keys that nothing reads =========================================================================
# (strategy or setup flags, the key set, who reads it: a word the error must name)
UNREAD = [
    (["--strategy", "sync"], "shadow.every=2", "fr-"),
    (["--strategy", "shadow-ma", "--workers", "2"], "shadow.every=2", "fr-"),
    (["--strategy", "shadow-ma", "--workers", "2"], "shadow.fr_sync=trainer", "fr-"),
    (["--strategy", "fr-easgd", "--workers", "2"], "shadow.max_syncs_per_second=5", "shadow-"),
    (["--strategy", "fr-ma", "--workers", "2"], "shadow.wait_for_update=true", "shadow-"),
    (["--strategy", "shadow-ma", "--workers", "2"], "shadow.block_lr=0.5", "bmuf"),
    (["--strategy", "shadow-easgd", "--workers", "2"], "shadow.block_momentum=0.5", "bmuf"),
    (["--strategy", "fr-ma", "--workers", "2"], "shadow.nesterov=true", "bmuf"),
    (["--strategy", "shadow-ma", "--workers", "2"], "shadow.sync_servers=2", "easgd"),
    (["--strategy", "gba", "--workers", "2"], "shadow.threads=2", "shadow"),
    (["--strategy", "oac"], "shadow.alpha=0.5", "shadow"),
    (["--strategy", "sync"], "pdasgd.backward_threads=3", "pdasgd"),
    (["--strategy", "oac"], "pdasgd.barrier=true", "pdasgd"),
    (["--strategy", "gba", "--workers", "2"], "pdasgd.intra_op_threads=2", "pdasgd"),
    (["--strategy", "sync"], "adapm.lookahead=8", "adapm"),
    (["--strategy", "gba", "--workers", "2"], "adapm.quantile=0.9", "adapm"),
    (["--strategy", "oac"], "adapm.round_interval=0.01", "adapm"),
    (["--strategy", "hogwild"], "adapm.technique=relocation", "adapm"),
    (["--strategy", "sync", "--workers", "2"], "ps.tolerance=5", "gba"),
    (["--strategy", "gba", "--workers", "2"], "ps.staleness=4", "hop_bs"),
    (["--strategy", "gba", "--workers", "2"], "ps.backup_workers=0", "hop_bw"),
    (["--strategy", "hop_bs", "--workers", "2"], "ps.buffer=3", "gba"),
    (["--strategy", "async", "--workers", "2"], "ps.decay=none", "gba"),
    (["--strategy", "gba", "--workers", "2"], "pipeline.staleness_bound=4", "pipeline"),
    (["--strategy", "sync"], "pipeline.coalesce_writes=false", "oac"),
    (["--strategy", "shadow-ma", "--workers", "2"], "pipeline.loader_threads=2", "pipeline"),
    (["--strategy", "adapm", "--workers", "2"], "pipeline.queue_size=8", "pipeline"),
    (["--set", "optimizer.dense=adagrad"], "optimizer.momentum=0.9", "sgd"),
    (["--set", "optimizer.dense=adam"], "optimizer.momentum=0.5", "sgd"),
    (["--strategy", "sync"], "optimizer.warmup_lr=0.01", "warmup"),
    (["--set", "optimizer.dense=sgd", "--set", "optimizer.entity=sgd"], "optimizer.eps=0.001", "adagrad"),
    # keys the section's own values leave unread, or the strategy whatever they say (issue 50)
    (["--strategy", "gba", "--workers", "2", "--set", "ps.stragglers=['1:4']"], "ps.straggler_quota=absolute",
     "straggler_cause: cpu_quota"),
    (["--strategy", "gba", "--workers", "2"], "ps.straggler_cause=cpu_quota", "ps.stragglers"),
    (["--strategy", "gba", "--workers", "2"], "ps.ray_idle_processes=2", "ps.engine: ray"),
    (["--strategy", "adapm", "--workers", "2"], "ps.ray_address=127.0.0.1:6379", "ps.engine: ray"),
    (["--strategy", "sync"], "store.malloc_arenas=4", "store.backend: mmap"),
    (["--strategy", "oac"], "store.readahead=true", "store.backend: mmap"),
    (["--strategy", "async"], "store.path=elsewhere", "store.backend: mmap"),
    (["--strategy", "shadow-ma", "--workers", "2"], "ps.dense=workers", "dense replica"),
    (["--strategy", "hogwild", "--workers", "2"], "ps.dense=workers", "dense replica"),
]

for _flags, _key, _reader in UNREAD:
    @case("unread_keys", f"{_key}[{' '.join(f for f in _flags if not f.startswith('--'))}]")
    def _unread(ws: Workspace, flags=_flags, key=_key, reader=_reader) -> None:
        line = _refused(ws, ws.train("kge", *flags, "--set", key), key.split("=")[0])
        assert reader.lower() in line.lower(), f"does not say who reads it ({reader}): {line}"


IMAGE_MODEL_KEYS = [("cnn", "image.hidden=[64]", "mlp"), ("mlp", "image.channels=[8,16]", "cnn"),
                    ("mlp", "image.fc=64", "cnn")]

for _model, _key, _reader in IMAGE_MODEL_KEYS:
    @case("unread_keys", f"{_key}[image {_model}]")
    def _unread_image(ws: Workspace, model=_model, key=_key, reader=_reader) -> None:
        data = ws.data("image")
        result = ws.cadence("-q", "train", "--task", "image", *data, "--model", model, "--epochs", "1",
                            "--batch-size", "32", "--set", "image.valid_size=40", "--set", "threads=1",
                            "--no-progress", "--set", key, "--out", str(ws.root / "run"))
        line = _refused(ws, result, key.split("=")[0])
        assert reader in line, f"does not say who reads it ({reader}): {line}"


# ==== 11. edge values ======================================================================================
# (strategy flags, the setting, a word of the allowed range the error must hold)
EDGE = [
    (["--strategy", "adapm", "--workers", "2"], "adapm.lookahead=0"),
    (["--strategy", "adapm", "--workers", "2"], "adapm.round_interval=1e300"),
    (["--strategy", "adapm", "--workers", "2"], "adapm.round_interval=1e-300"),
    (["--strategy", "adapm", "--workers", "2"], "adapm.initial_rate=1e300"),
    (["--strategy", "adapm", "--workers", "2"], "adapm.initial_rate=1e-300"),
    (["--strategy", "adapm", "--workers", "2"], "adapm.quantile=1.5"),
    (["--strategy", "adapm", "--workers", "2"], "adapm.alpha=0"),
    (["--strategy", "adapm", "--workers", "2"], "adapm.start_rounds=-1"),
    (["--strategy", "shadow-ma", "--workers", "2"], "shadow.max_syncs_per_second=1e300"),
    (["--strategy", "shadow-ma", "--workers", "2"], "shadow.max_syncs_per_second=-1"),
    (["--strategy", "fr-ma", "--workers", "2"], "shadow.every=0"),
    (["--strategy", "shadow-ma", "--workers", "2"], "shadow.alpha=1e300"),
    (["--strategy", "shadow-bmuf", "--workers", "2"], "shadow.block_momentum=1"),
    (["--strategy", "shadow-bmuf", "--workers", "2"], "shadow.block_lr=1e-300"),
    (["--strategy", "pdasgd"], "pdasgd.backward_threads=0"),
    (["--strategy", "gba"], "ps.workers=0"),
    (["--strategy", "gba", "--workers", "2"], "ps.emulated_latency=1e300"),
    (["--strategy", "gba", "--workers", "2"], "ps.shards=0"),
    (["--strategy", "oac"], "pipeline.stall_timeout=0"),
    (["--strategy", "oac"], "pipeline.stall_timeout=1e300"),
    (["--strategy", "sync"], "optimizer.lr=1e300"),
    (["--strategy", "sync"], "optimizer.weight_decay=1e300"),
    (["--strategy", "sync"], "optimizer.eps=1e-300"),
    (["--strategy", "sync"], "optimizer.momentum=1e300"),
    (["--strategy", "sync"], "train.reg_weight=1e300"),
]

for _flags, _setting in EDGE:
    @case("edge_values", f"{_setting}[{_flags[1]}]")
    def _edge(ws: Workspace, flags=_flags, setting=_setting) -> None:
        _refused(ws, ws.train("kge", *flags, "--set", setting, timeout=_guarded(flags, setting)), setting.split("=")[0])


# dense modules larger than the memory: refused before anything is allocated (issue 50), naming the setting
DENSE_SIZES = [("image", "mlp", "image.hidden=[1000000000]"), ("image", "cnn", "image.fc=100000000"),
               ("image", "cnn", "image.channels=[100000,100000]"), ("ctr", "deepfm", "ctr.hidden=[1000000,1000000]")]

for _task, _model, _setting in DENSE_SIZES:
    @case("edge_values", f"{_setting}[{_task} {_model}]")
    def _dense_size(ws: Workspace, task=_task, model=_model, setting=_setting) -> None:
        if task == "image":  # (the harness's image options name image.hidden, which a CNN does not read)
            result = ws.cadence("-q", "train", "--task", "image", *ws.data("image"), "--model", model, "--epochs", "1",
                                "--set", "image.valid_size=40", "--set", "threads=1", "--no-progress",
                                "--set", setting, "--out", str(ws.root / "run"))
        else:
            result = ws.train(task, "--model", model, "--set", setting)
        line = _refused(ws, result, setting.split("=")[0])
        assert "GiB" in line and "available" in line, f"does not say how much memory: {line}"


def _idx(path: Path, dims: tuple[int, ...], payload: bytes = b"", compress: bool = False) -> None:
    header = struct.pack(">HBB", 0, 0x08, len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    data = header + payload
    path.write_bytes(gzip.compress(data) if compress else data)


def _image_run(ws: Workspace, data: Path, *extra: str) -> Result:
    return ws.cadence("-q", "train", "--task", "image", "--dataset", str(data), "--model", "mlp", "--epochs", "1",
                      "--batch-size", "8", "--set", "image.hidden=[8]", "--set", "threads=1", "--no-progress",
                      *extra, "--out", str(ws.root / "run"))


def _broken_images(ws: Workspace, dims: tuple[int, ...], payload: bytes) -> tuple[Path, Path]:
    """A copy of the tiny image data set whose training images file is ``dims`` and ``payload``."""
    data = Path(ws.data("image")[1])
    target = data / "train-images-idx3-ubyte.gz"
    target.unlink()
    plain = data / "train-images-idx3-ubyte"
    _idx(plain, dims, payload)
    return data, plain


IDX_BROKEN = {
    "zero_images": ((0, 12, 12), b""),
    "zero_pixels": ((240, 0, 0), b""),
    "overflowing_sizes": ((2**32 - 1, 2**32 - 1, 2**32 - 1), b"\0" * 64),
    "sizes_past_the_file": ((240, 12, 12), b"\0" * 100),
    "one_dimension": ((240,), b"\0" * 240),
}

for _name, (_dims, _payload) in IDX_BROKEN.items():
    @case("edge_values", f"idx_{_name}")
    def _idx_broken(ws: Workspace, dims=_dims, payload=_payload) -> None:
        data, plain = _broken_images(ws, dims, payload)
        _refused(ws, _image_run(ws, data, "--set", "image.valid_size=4"), "/" + plain.name)


@case("edge_values")
def image_valid_size_past_the_images(ws: Workspace) -> None:
    data = Path(ws.data("image")[1])
    _refused(ws, _image_run(ws, data, "--set", "image.valid_size=100000000"), "image.valid_size")


# ==== 12. settings that hang ===============================================================================
def _bounded(ws: Workspace, *flags: str, task: str = "kge") -> Result:
    start = time.monotonic()
    result = ws.train(task, *flags, timeout=HANG_LIMIT)
    took = time.monotonic() - start
    assert took < HANG_LIMIT, f"took {took:.0f} s (a hang?)"
    assert "Traceback" not in result.err, str(result)
    if result.code != 0:
        ws.fails(result)
    return result


HANGS = [
    ["--strategy", "shadow-ma", "--workers", "2", "--set", "shadow.max_syncs_per_second=1e-9"],
    ["--strategy", "shadow-easgd", "--workers", "2", "--set", "shadow.max_syncs_per_second=1e-9"],
    ["--strategy", "shadow-ma", "--workers", "2", "--set", "shadow.wait_for_update=true"],
    ["--strategy", "adapm", "--workers", "2", "--set", "adapm.initial_rate=1e-9"],
    ["--strategy", "adapm", "--workers", "2", "--set", "adapm.initial_rate=1e12"],
    ["--strategy", "adapm", "--workers", "2", "--set", "adapm.quantile=0.99999999999"],
    ["--strategy", "adapm", "--workers", "2", "--set", "adapm.start_rounds=1000000000"],
    ["--strategy", "adapm", "--workers", "2", "--set", "adapm.round_interval=100000"],
    ["--strategy", "adapm", "--workers", "2", "--set", "adapm.lookahead=100000000"],
    ["--strategy", "hop_bs", "--workers", "2", "--set", "ps.staleness=0"],
    ["--strategy", "pdasgd", "--set", "pdasgd.barrier=true", "--set", "pdasgd.backward_threads=8"],
]

for _flags in HANGS:
    @case("hangs", f"{_flags[1]}[{' '.join(f for f in _flags[2:] if not f.startswith('--'))}]")
    def _hang(ws: Workspace, flags=_flags) -> None:
        _bounded(ws, *flags)


# ==== 13. metrics of empty splits ===========================================================================
def _summary(ws: Workspace) -> dict:
    return json.loads((ws.root / "run" / "summary.json").read_text())


def _absent_or_refused(ws: Workspace, result: Result, file: str, metrics: tuple[str, ...]) -> None:
    """An empty split: an error naming ``file``, or a run in which no metric of it is made up: the
    test metrics (summary.json's own keys) and every validation record's are null or absent."""
    if result.code != 0:
        ws.fails(result, file)
        return
    ws.succeeds(result)
    summary = _summary(ws)
    records = [json.loads(line) for line in (ws.root / "run" / "metrics.jsonl").read_text().splitlines() if line]
    for metric in metrics:
        assert summary.get(metric) is None, f"test {metric} = {summary.get(metric)} from an empty split"
        assert summary.get(f"best_valid_{metric}") is None, f"best valid {metric}: {summary}"
        for record in records:
            assert record.get(metric) is None, f"{record.get('split')} {metric} = {record.get(metric)}: {record}"
    assert "0.0000" not in result.out, f"a made-up metric printed:\n{result}"


def _empty_graph_split(ws: Workspace, split: str) -> list[str]:
    data = ws.data("kge")
    (Path(data[1]) / f"{split}.txt").write_text("")
    return data


for _split in ("valid", "test"):
    @case("empty_splits", f"kge_{_split}_file_empty")
    def _kge_empty(ws: Workspace, split=_split) -> None:
        data = _empty_graph_split(ws, split)
        _absent_or_refused(ws, ws.train("kge", data=data), f"/{split}.txt", ("mrr", "hits@10"))


@case("empty_splits")
def kge_empty_valid_with_early_stopping(ws: Workspace) -> None:
    data = _empty_graph_split(ws, "valid")
    result = ws.train("kge", "--set", "eval.patience=1", "--epochs", "4", data=data)
    _absent_or_refused(ws, result, "/valid.txt", ("mrr",))
    if result.code == 0:
        assert _summary(ws)["epochs"] == 4, "early stopping acted on an empty split's metric"


@case("empty_splits")
def eval_command_on_an_empty_split(ws: Workspace) -> None:
    run, data = ws.trained("kge")
    (Path(data[1]) / "valid.txt").write_text("")
    result = ws.cadence("-q", "eval", str(run), "--split", "valid")
    if result.code != 0:
        ws.fails(result, "/valid.txt")
    else:
        assert "0.0000" not in result.out and "nan" not in result.out.lower(), f"made up:\n{result}"


@case("empty_splits")
def image_zero_validation_images(ws: Workspace) -> None:
    data = Path(ws.data("image")[1])
    result = _image_run(ws, data, "--set", "image.valid_size=0", "--set", "eval.every=1")
    _absent_or_refused(ws, result, "valid", ("accuracy",))


@case("empty_splits")
def image_zero_test_images(ws: Workspace) -> None:
    data = Path(ws.data("image")[1])
    (data / "t10k-images-idx3-ubyte.gz").unlink()
    (data / "t10k-labels-idx1-ubyte").unlink()
    _idx(data / "t10k-images-idx3-ubyte", (0, 12, 12))
    _idx(data / "t10k-labels-idx1-ubyte", (0,))
    _absent_or_refused(ws, _image_run(ws, data, "--set", "image.valid_size=40"), "/t10k", ("accuracy",))


@case("empty_splits")
def mf_split_without_test_ratings(ws: Workspace) -> None:
    data = ws.data("mf")
    path = Path(data[1])
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:6]))  # 6 ratings: 80/10/10 leaves none
    _absent_or_refused(ws, ws.train("mf", data=data), "/" + path.name, ("rmse", "mae"))


@case("empty_splits")
def w2v_without_analogy_questions(ws: Workspace) -> None:
    """The tiny corpus's words are in no analogy question: the accuracy is absent, never 0.0."""
    ws.succeeds(ws.train("w2v", "--epochs", "1"))
    summary = _summary(ws)
    assert summary.get("analogy_questions") == 0, summary
    assert summary.get("analogy") is None, f"analogy {summary.get('analogy')} with no question answered"


@case("empty_splits")
def kge_train_split_too_small_for_the_workers(ws: Workspace) -> None:
    data = ws.data("kge")
    train = Path(data[1]) / "train.txt"
    train.write_text("".join(train.read_text().splitlines(keepends=True)[:3]))
    result = ws.train("kge", "--strategy", "gba", "--workers", "4", "--batch-size", "2", data=data)
    if result.code != 0:
        ws.fails(result)
        ws.absent(ws.root / "run")
    else:
        ws.succeeds(result)


@case("empty_splits")
def adapm_split_too_small_for_the_nodes(ws: Workspace) -> None:
    data = ws.data("kge")
    train = Path(data[1]) / "train.txt"
    train.write_text("".join(train.read_text().splitlines(keepends=True)[:2]))
    result = ws.train("kge", "--strategy", "adapm", "--workers", "4", "--batch-size", "1", data=data)
    if result.code != 0:
        ws.fails(result)
        ws.absent(ws.root / "run")
    else:
        ws.succeeds(result)


# ==== 14. resources =======================================================================================
RESOURCES = [
    (["--set", "threads=1000000"], "threads"),
    (["--strategy", "oac", "--set", "pipeline.loader_threads=1000000"], "pipeline.loader_threads"),
    (["--strategy", "shadow-ma", "--workers", "2", "--set", "shadow.threads=1000000"], "shadow.threads"),
    (["--strategy", "pdasgd", "--set", "pdasgd.backward_threads=1000000"], "pdasgd.backward_threads"),
    (["--strategy", "gba", "--workers", "1000000"], "ps.workers"),
    (["--strategy", "adapm", "--workers", "1000000"], "ps.workers"),
    (["--dim", "4000000000"], "model.dim"),
    (["--set", "train.negatives=2000000000"], "train.negatives"),
]

for _flags, _setting in RESOURCES:
    @case("resources", f"{_setting}[{' '.join(_flags)}]")
    def _resource(ws: Workspace, flags=_flags, setting=_setting) -> None:
        start = time.monotonic()
        line = _refused(ws, ws.train("kge", *flags, timeout=HANG_LIMIT), setting)
        assert time.monotonic() - start < HANG_LIMIT, "took too long to refuse"
        assert any(word in line for word in ("GiB", "MiB", "threads", "limit", "at most")), \
            f"does not say what it would need: {line}"


@case("resources")
def gzip_bomb_in_an_image_file(ws: Workspace) -> None:
    """An IDX ``.gz`` whose header and stream claim 64 GiB of pixels (concatenated gzip members of
    zeros, a few MiB on disk): refused before decompressing, naming the file and its size."""
    data = Path(ws.data("image")[1])
    target = data / "train-images-idx3-ubyte.gz"
    count, side = 2**26, 32  # 2**26 images of 32x32: 64 GiB
    header = struct.pack(">HBB", 0, 0x08, 3) + struct.pack(">III", count, side, side)
    zeros = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = zeros.compress(b"\0" * (64 << 20)) + zeros.flush()
    with target.open("wb") as out:
        out.write(gzip.compress(header))
        for _ in range(16):  # 1 GiB of zeros in 16 members; the header claims 64
            out.write(member)
    start = time.monotonic()
    _refused(ws, _image_run(ws, data, "--set", "image.valid_size=4"), "/" + target.name)
    assert time.monotonic() - start < HANG_LIMIT


# ==== 15. Ray with the new strategies ======================================================================
def _ray_worker_pids() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "ray::Host" in command:  # (an actor: a trainer, a server, a node; not an idle worker)
                found.add(int(entry.name))
    return found


def _kill_a_ray_worker_mid_run(ws: Workspace, runtime: list[str]) -> None:
    data = ws.data("kge")
    out = ws.root / "run"
    before = _ray_worker_pids()
    process = ws.runner.start(["-q", "train", *train_args("kge", data), *runtime, "--epochs", "400",
                               "--set", "eval.every=0", "--out", str(out)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any((out / "checkpoints").glob("epoch-*")) and process.poll() is None:
        time.sleep(0.2)
    victims = _ray_worker_pids() - before
    assert victims, "no Ray worker process appeared"
    os.kill(max(victims), signal.SIGKILL)
    try:
        _, err = process.communicate(timeout=180)
    except Exception:
        process.kill()
        raise AssertionError("the run did not end after a Ray worker was killed")
    assert "Traceback" not in err and "ActorDiedError" not in err, err[-3000:]
    if process.returncode != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("cadence: error:"), err[-3000:]
        assert "--resume" in lines[-1], f"does not say how to go on: {lines[-1]}"


RAY_KILLS = {
    "shadow-ma": ["--strategy", "shadow-ma", "--workers", "2", "--set", "shadow.threads=2", "--engine", "ray"],
    "fr-easgd": ["--strategy", "fr-easgd", "--workers", "2", "--set", "shadow.threads=2", "--engine", "ray"],
    "gba": ["--strategy", "gba", "--workers", "2", "--engine", "ray"],
    "adapm": ["--strategy", "adapm", "--workers", "2", "--set", "adapm.lookahead=8", "--engine", "ray"],
}

for _name, _runtime in RAY_KILLS.items():
    @case("ray_strategies", f"kill_a_ray_process[{_name}]", processes=True, slow=True)
    def _ray_kill(ws: Workspace, runtime=_runtime) -> None:
        _kill_a_ray_worker_mid_run(ws, runtime)


def _ray_sigterm_then_resume(ws: Workspace, runtime: list[str], sign: int) -> None:
    data = ws.data("kge")
    out = ws.root / "run"
    process = ws.runner.start(["-q", "train", *train_args("kge", data), *runtime, "--epochs", "400",
                               "--set", "eval.every=0", "--out", str(out)])
    result = interrupt_when(process, lambda: any((out / "checkpoints").glob("epoch-*")), sign=sign)
    assert result.code in (130, 143), str(result)
    assert "Traceback" not in result.err, str(result)
    done = max(int(p.name.removeprefix("epoch-")) for p in (out / "checkpoints").glob("epoch-*"))
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(out), "--epochs", str(done + 1)))


RAY_SIGNALS = {
    "fr-easgd-sigint": (RAY_KILLS["fr-easgd"], signal.SIGINT),
    "adapm-sigint": (RAY_KILLS["adapm"], signal.SIGINT),
    "shadow-ma-sigterm": (RAY_KILLS["shadow-ma"], signal.SIGTERM),
    "gba-sigterm": (RAY_KILLS["gba"], signal.SIGTERM),
}

for _name, (_runtime, _sign) in RAY_SIGNALS.items():
    @case("ray_strategies", f"signal_then_resume[{_name}]", processes=True, slow=True)
    def _ray_signal(ws: Workspace, runtime=_runtime, sign=_sign) -> None:
        _ray_sigterm_then_resume(ws, runtime, sign)


@case("interrupts", "sigterm_then_resume[kge-oac]", processes=True)
def sigterm_then_resume(ws: Workspace) -> None:
    """``kill`` (a scheduler ending a job) during training: exit 143 with one line saying how to go
    on, no traceback, and ``--resume`` finishes the run."""
    data = ws.data("kge")
    out = ws.root / "run"
    process = ws.runner.start(["-q", "train", *train_args("kge", data, "oac"), "--epochs", "400",
                               "--set", "eval.every=0", "--out", str(out)])
    result = interrupt_when(process, lambda: any((out / "checkpoints").glob("epoch-*")), sign=signal.SIGTERM)
    assert result.code == 143, str(result)
    assert "Traceback" not in result.err, str(result)
    assert result.err.strip().splitlines()[-1].startswith("cadence: terminated"), str(result)
    done = max(int(p.name.removeprefix("epoch-")) for p in (out / "checkpoints").glob("epoch-*"))
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(out), "--epochs", str(done + 1)))


for _sign in (signal.SIGINT, signal.SIGTERM):
    @case("interrupts", f"auto_interrupted_mid_trial[{signal.Signals(_sign).name}]", processes=True)
    def _auto_interrupted(ws: Workspace, sign=_sign) -> None:
        """Ctrl-C (or ``kill``) while ``--strategy auto`` times a candidate in a process of its own:
        the command exits 130 (143), and before it does the trial's process has ended and its
        scratch directory is gone (issue 50: the trial trained on, its directory stayed)."""
        import subprocess

        data = ws.data("kge")
        scratch = ws.root / "tmp"
        scratch.mkdir()
        process = subprocess.Popen(
            ws.runner.command(["-q", "train", *train_args("kge", data), "--strategy", "auto", "--epochs", "10000",
                               "--set", "auto.trial_batches=100000", "--set", "eval.every=0",
                               "--out", str(ws.root / "run")]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ws.runner.env({"TMPDIR": str(scratch)}))
        trials: list[Path] = []

        def a_trial_runs() -> bool:
            trials.extend(p for p in scratch.glob("cadence-auto-*") if p not in trials)
            return bool(trials)

        result = interrupt_when(process, a_trial_runs, sign=sign)
        assert result.code == (130 if sign == signal.SIGINT else 143), str(result)
        assert "Traceback" not in result.err, str(result)
        assert not list(scratch.glob("cadence-auto-*")), list(scratch.iterdir())
        pid = int(trials[0].name.split("-")[2])  # (scratch_prefix: cadence-auto-PID-)
        assert not Path(f"/proc/{pid}").exists(), f"the trial's process {pid} outlived the command"


# ==== 16. a damaged run directory, read by every reader ======================================================
# (the file, how it is damaged) x (a reader: its arguments after the run directory)
DAMAGES = {"config-empty": ("config.yaml", b""), "config-list": ("config.yaml", b"[1, 2]\n"),
           "config-not-utf8": ("config.yaml", b"\xff\xfe\x00task: kge\n")}
READERS = {"eval": lambda ws, run: ["eval", str(run)],
           "export": lambda ws, run: ["export", str(run), "--out", str(ws.root / "exported")],
           "resume": lambda ws, run: ["train", "--resume", str(run), "--epochs", "4"],
           "init-from": lambda ws, run: ["train", *train_args("kge", ws.data("kge")), "--init-from", str(run),
                                          "--out", str(ws.root / "grown")],
           "predict": lambda ws, run: ["predict", str(run), "tails", "e1", "r1"]}

for _damage, (_file, _bytes) in DAMAGES.items():
    for _reader, _argv in READERS.items():
        @case("checkpoints", f"damaged_{_damage}[{_reader}]")
        def _damaged(ws: Workspace, file=_file, body=_bytes, argv=_argv) -> None:
            """One line naming the damaged file, whoever reads it (issue 50: an empty config.yaml read as
            every default, the default data set's, and a grown run trained from it); nothing written."""
            run, _ = ws.trained("kge")
            (run / file).write_bytes(body)
            before = sorted(path.relative_to(run) for path in run.rglob("*"))
            ws.fails(ws.cadence("-q", *argv(ws, run)), str(run / file))
            assert sorted(path.relative_to(run) for path in run.rglob("*")) == before
            for written in ("exported", "grown"):
                ws.absent(ws.root / written)
