"""Each setting's checks, as a user meets them: a value out of range is one error naming the key and
where it was given (``cadence.settings``: the checks a field declares, a section's own ``check``)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from cadence.config import Config, load_config
from cadence.errors import ConfigError
from cadence.resources import thread_limit
from cadence.settings import SECTIONS, flatten

# (a --set item, what the error says after "--set item: "): written out here, not read from the declarations
REFUSED = [
    ("train.epochs=0", "train.epochs must be positive, got 0"),
    ("optimizer.lr=0", "optimizer.lr must be positive, got 0"),
    ("eval.every=-1", "eval.every must not be negative, got -1"),
    ("mf.row_blocks=-2", "mf.row_blocks must not be negative, got -2"),
    ("store.path=' '", "store.path is empty; give a path or name (or leave it out)"),
    ("strategy=''", "strategy is empty; give a path or name (or leave it out)"),
    ("adapm.lookahead=100001", "adapm.lookahead must be between 1 and 100000 (batches of intent signalled ahead), "
                               "got 100001"),
    ("optimizer.eps=2", "optimizer.eps must be between 1e-30 and 1 (Adagrad's epsilon"),
    ("model.gamma=-2e6", "model.gamma must be between -1e+06 and 1e+06 (a margin), got -2e+06"),
    ("shadow.max_syncs_per_second=1e-5", "shadow.max_syncs_per_second must be between 0.0001 and 1e+06"),
    ("adapm.sync_share=1.5", "adapm.sync_share must be between 0.001 and 1"),
    ("optimizer.momentum=1", "optimizer.momentum must be in [0, 1), got 1.0"),
    ("optimizer.nesterov=true", "optimizer.nesterov needs optimizer.momentum > 0"),
    ("shadow.alpha=1.5", "shadow.alpha must be in [0, 1], got 1.5"),
    ("shadow.block_momentum=1", "shadow.block_momentum must be in [0, 1), got 1.0"),
    ("adapm.alpha=0", "adapm.alpha must be in (0, 1], got 0.0"),
    ("adapm.quantile=1", "adapm.quantile must be in (0, 1), got 1.0"),
    ("ctr.last_period=-2", "ctr.last_period must be -1 (the second to last period) or a period, got -2"),
    ("ctr.dropout=1", "ctr.dropout must be in [0, 1), got 1.0"),
    ("image.dropout=-0.1", "image.dropout must be in [0, 1), got -0.1"),
    ("image.channels=[8,0]", "image.channels must hold positive widths, got [8, 0]"),
    ("ctr.hidden=[-1]", "ctr.hidden must hold positive widths, got [-1]"),
    ("mf.fold=5", "mf.fold must be less than mf.folds (5), got 5"),
    ("auto.margin=0.9", "auto.margin must be a finite ratio of at least 1"),
]


@pytest.mark.parametrize("item, message", REFUSED, ids=[item for item, _ in REFUSED])
def test_a_value_out_of_range_is_one_error_naming_the_key_where_it_was_given(item: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [item])
    assert str(err.value).startswith(f"--set {item}: {message}"), str(err.value)


@pytest.mark.parametrize("item", ["shadow.max_syncs_per_second=0", "adapm.sync_share=1", "optimizer.momentum=0.9",
                                  "shadow.alpha=0", "mf.fold=4", "mf.row_blocks=auto", "store.path=/tmp/x"])
def test_the_edges_of_a_range_and_the_off_value_are_accepted(item: str) -> None:
    load_config(None, [item])


def test_a_count_of_threads_past_the_limit_is_refused_and_so_is_the_product_a_worker_starts() -> None:
    limit = thread_limit()
    with pytest.raises(ConfigError, match=rf"^--set pipeline.loader_threads={limit + 1}: pipeline.loader_threads: "
                                          rf"{limit + 1:,} threads; a run may start at most {limit:,} here"):
        load_config(None, [f"pipeline.loader_threads={limit + 1}"])
    workers = 2
    threads = limit // workers + 1
    with pytest.raises(ConfigError, match=rf"^--set adapm.threads={threads}: ps.workers x adapm.threads "
                                          rf"\({workers} x {threads:,}\): {workers * threads:,} threads"):
        load_config(None, [f"ps.workers={workers}", f"adapm.threads={threads}"])


@pytest.mark.parametrize("key", ["record_order", "out", "store.path", "data.dataset"])
def test_a_path_or_name_with_a_nul_character_is_refused_naming_the_flag(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--flag: {key} contains a NUL character; give a path or name$"):
        load_config(None, values=[(key, "runs/a\x00b", "--flag")])


def test_a_file_line_names_the_setting(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  epochs: 3\nshadow:\n  alpha: 2\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4: shadow.alpha must be in \[0, 1\], got 2.0$"):
        load_config(path)


def test_every_declared_range_refuses_just_past_each_end() -> None:
    """From the declarations themselves: each ``between`` holds its ends and refuses beyond them."""
    flat = flatten(Config().to_dict())
    declared = []
    for prefix, section in [("", Config()), *((f"{name}.", kind()) for name, kind in SECTIONS.items())]:
        stack = [(prefix, section)]
        while stack:
            at, item = stack.pop()
            for f in dataclasses.fields(item):
                value = getattr(item, f.name)
                if dataclasses.is_dataclass(value):
                    stack.append((f"{at}{f.name}.", value))
                elif f.metadata.get("between"):
                    declared.append((f"{at}{f.name}", f.metadata["between"]))
    assert len(declared) >= 20
    for key, (low, high, _) in declared:
        assert key in flat
        whole = isinstance(flat[key], int) and not isinstance(flat[key], bool)
        for inside in (low, high):
            load_config(None, [f"{key}={int(inside) if whole else inside!r}"])
        for outside in ((low - 1, high + 1) if whole else (low - abs(low) * 0.5 - 1e-3, high * 1.5 + 1)):
            with pytest.raises(ConfigError, match=f"{key} must"):
                load_config(None, [f"{key}={int(outside) if whole else outside!r}"])


def test_the_config_module_holds_the_root_sections_and_no_strategys():
    """A strategy family's sections are its own (``settings.SECTIONS``), never fields of ``Config``, and
    ``config.py`` keeps to the root sections (issue 48: under 300 lines, from 775)."""
    import dataclasses
    from pathlib import Path

    import cadence.config
    from cadence.config import Config
    from cadence.settings import SECTIONS

    assert SECTIONS and not set(SECTIONS) & {item.name for item in dataclasses.fields(Config)}
    assert len(Path(cadence.config.__file__).read_text().splitlines()) < 300


@pytest.mark.parametrize(("overrides", "key", "reader"), [
    (["task=mf"], "mf.folds=3", "mf.split: kfold"),
    (["task=mf"], "mf.fold=1", "mf.split: kfold"),
    (["task=ctr"], "ctr.num_periods=4", "ctr.split: periods"),
    (["task=ctr"], "ctr.first_period=1", "ctr.split: periods"),
    (["task=ctr"], "ctr.last_period=3", "ctr.split: periods"),
    ([], "store.readahead=true", "store.backend: mmap"),
    (["strategy=gba", "ps.workers=2", "ps.stragglers=['1:4']"], "ps.straggler_quota=absolute", "cpu_quota"),
    (["strategy=gba", "ps.workers=2"], "ps.ray_address=127.0.0.1:6379", "ps.engine: ray"),
    (["strategy=shadow-easgd", "ps.workers=2", "task=ctr"], "ps.dense=workers", "dense replica"),
])
def test_a_key_the_run_s_own_values_leave_unread_is_refused(overrides, key, reader) -> None:
    """Issue 50: keys read only under another key's value (or never by the chosen strategy) were
    accepted silently; each is one line naming the key and what reads it, and accepted where read."""
    from cadence.api import prepare_config
    from cadence.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(key.split("=")[0]) + ".*" + re.escape(reader)):
        prepare_config(load_config(None, [*overrides, key]))
    enabling = {"mf.split: kfold": ["mf.split=kfold"], "ctr.split: periods": ["ctr.split=periods"],
                "store.backend: mmap": ["store.backend=mmap"], "ps.engine: ray": ["ps.engine=ray"],
                "cpu_quota": None, "dense replica": None}[reader]
    if enabling is not None:
        prepare_config(load_config(None, [*overrides, *enabling, key]))
