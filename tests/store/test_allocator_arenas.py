"""``store.malloc_arenas``: a table on disk shares its memory cgroup with the process's heap, and a
pipeline's threads each kept a glibc arena of freed batch blocks (an out-of-core OAC run's heap grew
from 460 to 750 MiB under a 900 MiB cap and left the page cache 80 MiB). Checked against glibc's own
account of its arenas (``malloc_info``), in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cadence import resources

PROBE = r"""
import ctypes, json, re, sys, tempfile, threading
from cadence.resources import limit_allocator_arenas

libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def arenas():
    with tempfile.NamedTemporaryFile(suffix=".xml") as file:
        stream = libc.fopen(file.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        return len(re.findall(r'<heap nr="\d+"', open(file.name).read()))

limited = limit_allocator_arenas(int(sys.argv[1]))
before = arenas()
ready = threading.Barrier(7)
def work():
    blocks = [libc.malloc(size) for size in (200_000, 70_000, 1 << 20)]  # (below the mmap threshold: an arena's)
    ready.wait()  # every thread alive at once: none takes an arena another has left
    for block in blocks:
        libc.free(block)
    ready.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for thread in threads:
    thread.start()
ready.wait(); ready.wait()
for thread in threads:
    thread.join()
print(json.dumps({"limited": limited, "before": before, "after": arenas()}))
"""


def probe(count: int) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(count)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/lib/x86_64-linux-gnu/libc.so.6").exists()
                    and not Path("/usr/lib/libc.so.6").exists(), reason="glibc only")
def test_limited_arenas_stop_new_threads_from_taking_arenas_of_their_own() -> None:
    free = probe(0)  # glibc's default: each new thread its own arena
    assert not free["limited"] and free["after"] >= free["before"] + 5, free
    limited = probe(1)
    assert limited["limited"] and limited["after"] == limited["before"], limited


def test_a_pipeline_on_a_table_on_disk_limits_the_arenas_before_its_threads_start(tiny_graph: Path, tmp_path: Path,
                                                                               monkeypatch) -> None:
    from cadence import api
    from cadence.strategies.pipelined import runtime as pipeline_runtime
    from tests.conftest import make_config

    asked = []
    monkeypatch.setattr(pipeline_runtime, "limit_allocator_arenas", lambda count: asked.append(count) or True)
    for backend, arenas, expected in (("mmap", 1, [1]), ("mmap", 3, [3]), ("memory", 1, [])):
        asked.clear()
        config = api.prepare_config(make_config(tmp_path / backend, f"data.dataset={tiny_graph}", "strategy=oac",
                                                f"store.backend={backend}", f"store.malloc_arenas={arenas}",
                                                f"store.path={tmp_path / 'store'}" if backend == "mmap" else "seed=0"))
        task = api.TASKS.get("kge")(config)
        runtime = api.trial_runtime(config, task, tmp_path / "scratch")
        runtime.close()
        assert asked == expected


def test_malloc_arenas_out_of_range_is_one_line(tiny_graph: Path) -> None:
    from cadence.errors import ConfigError
    from tests.conftest import make_config

    with pytest.raises(ConfigError, match="store.malloc_arenas must be between 0 and 4096"):
        make_config(None, f"data.dataset={tiny_graph}", "store.malloc_arenas=-1")
    assert resources.limit_allocator_arenas(0) is False  # 0: glibc's default, nothing changed
