"""How a config section is declared and read: the machinery under ``cadence.config``.

A section is a dataclass whose fields are its settings. A field states its own checks where it is
declared (``setting``: positive, not negative, between two bounds, a count of threads, not empty);
a check across fields is the section's ``check(at, root)`` method. ``SECTIONS`` holds the sections
a part of the library above this layer contributes to the config (each strategy family its own:
``adapm``, ``ps``, ``shadow``, ``pdasgd``), composed into ``Config`` beside its root sections.

Reading is strict: an unknown key or a value of the wrong type is a ``ConfigError`` naming the
dotted key and, where the value came from a file, its path and line (``where``: dotted key ->
``file:line``, or the flag that gave it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import yaml

from cadence.errors import ConfigError
from cadence.resources import check_threads

# name -> a section class (a dataclass, its defaults its fields'), in the order they were registered
SECTIONS: dict[str, type] = {}


def section(name: str) -> Callable[[type], type]:
    """Register a dataclass as the config section ``name`` (``config.<name>``, the keys ``<name>.*``)."""
    def add(kind: type) -> type:
        if name in SECTIONS:
            raise ValueError(f"config section {name!r} is registered twice")
        SECTIONS[name] = kind
        return kind

    return add


def setting(default: Any = MISSING, *, factory: Callable[[], Any] | None = None, positive: bool = False,
            non_negative: bool = False, between: tuple[float, float, str] | None = None, off_at_zero: bool = False,
            threads: bool = False, not_empty: bool = False) -> Any:
    """A field of a section with the checks its value must pass when a config is read.

    ``positive`` / ``non_negative``: a number's sign (a word such as ``auto`` is a Literal's);
    ``between``: (lowest, highest, what the setting is), checked unless None (or 0 with
    ``off_at_zero``: a setting whose 0 means off); ``threads``: a count of threads (or processes)
    of its own, at most ``resources.thread_limit()``; ``not_empty``: a path or name that an empty
    string would silently turn into the current directory (or nothing), and none may hold a NUL."""
    checks = {"positive": positive, "non_negative": non_negative, "between": between, "off_at_zero": off_at_zero,
              "threads": threads, "not_empty": not_empty}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=checks)
    return dataclasses.field(default=default, metadata=checks)


def locate(key: str, where: dict[str, str]) -> str:
    """``file:line: `` (or ``--set ...: ``) where ``key``, or a key under it, was given; else ''."""
    if key in where:
        return f"{where[key]}: "
    inside = [origin for given, origin in where.items() if given.startswith(key + ".")]  # a key set under a value
    return f"{inside[0]}: " if inside else ""


class At:
    """What a section's ``check`` is given to name its keys: ``at.fail(name, message)`` raises the
    error for the setting ``name`` of this section (``{prefix}{name} {message}``, located)."""

    def __init__(self, prefix: str, where: dict[str, str]):
        self.prefix = prefix
        self.where = where

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def origin(self, key: str) -> str:
        """Where the dotted ``key`` (of any section) was given, as an error's prefix."""
        return locate(key, self.where)

    def fail(self, name: str, message: str) -> typing.NoReturn:
        key = self.key(name)
        raise ConfigError(f"{locate(key, self.where)}{key} {message}")


def build(cls: type, data: Any, prefix: str, where: dict[str, str],
          extra: dict[str, type] | None = None) -> tuple[Any, dict[str, Any]]:
    """(an instance of the section ``cls`` from ``data``, the sections of ``extra`` built from their
    keys in ``data``: name -> instance, every one of ``extra``, defaults where absent)."""
    section = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{locate(section, where)}{section} must be a mapping, got {data!r}")
    extra = extra or {}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    built: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name in extra:
            built[name] = convert(extra[name], value, key, where)
            continue
        if name not in fields:
            close = difflib.get_close_matches(str(name), [*fields, *extra], n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(f"{locate(key, where)}unknown key {key!r}{hint}")
        kwargs[name] = convert(hints[name], value, key, where)
    return cls(**kwargs), {name: built[name] if name in built else kind() for name, kind in extra.items()}


def convert(tp: Any, value: Any, key: str, where: dict[str, str]) -> Any:
    """``value`` as the type ``tp`` of the setting ``key``, or a ``ConfigError`` naming it."""
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key + ".", where)[0]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return convert(option, value, key, where)
            except ConfigError as err:
                errors.append(err)
        if len(errors) > 1:  # a number or a word (int | Literal["auto"]): one line naming both
            kinds = [f"one of {', '.join(map(str, typing.get_args(option)))}" if typing.get_origin(option) is Literal
                     else f"of type {option.__name__}" for option in options if option is not type(None)]
            raise ConfigError(f"{locate(key, where)}{key} must be {' or '.join(kinds)}; "
                              f"got {type(value).__name__} {value!r}")
        raise errors[0]
    if origin is list:
        if not isinstance(value, list):
            value = [value] if value is not None else []
        (item_type,) = typing.get_args(tp)
        return [convert(item_type, item, f"{key}[{i}]", where) for i, item in enumerate(value)]
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(
                f"{locate(key, where)}{key} must be one of {', '.join(map(str, choices))}; got {value!r}"
            )
        return value
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if tp is float and isinstance(value, str) and _not_finite(value):
        raise ConfigError(f"{locate(key, where)}{key} must be a finite number, got {value!r}")
    if tp is int and ok and not -2**63 <= value < 2**63:
        raise ConfigError(f"{locate(key, where)}{key} is too large, got {value}")
    if not ok:
        quote = (" (quote it to keep it text: YAML reads some words, such as 1:4, 0x1f or yes, as numbers or booleans)"
                 if tp is str and isinstance(value, (bool, int, float)) else "")
        raise ConfigError(
            f"{locate(key, where)}{key} must be of type {tp.__name__}, got {type(value).__name__} {value!r}{quote}"
        )
    if tp is float and not math.isfinite(value):  # no setting means NaN or an infinity
        raise ConfigError(f"{locate(key, where)}{key} must be a finite number, got {value!r}")
    return float(value) if tp is float else value


def _not_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def check(section: Any, prefix: str, where: dict[str, str], root: Any) -> None:
    """Each setting of ``section`` (and of the sections inside it) against the checks its field
    declares (``setting``), then the section's own ``check(at, root)`` where it has one."""
    for item in dataclasses.fields(section):
        key, value, rules = f"{prefix}{item.name}", getattr(section, item.name), item.metadata
        if dataclasses.is_dataclass(value):
            check(value, key + ".", where, root)
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)  # (a word is a Literal's)
        if rules.get("positive") and number and value <= 0:
            raise ConfigError(f"{locate(key, where)}{key} must be positive, got {value}")
        if rules.get("non_negative") and number and value < 0:
            raise ConfigError(f"{locate(key, where)}{key} must not be negative, got {value}")
        if rules.get("not_empty") and value is not None and not str(value).strip():
            raise ConfigError(f"{locate(key, where)}{key} is empty; give a path or name (or leave it out)")
        if rules.get("not_empty") and value is not None and "\0" in str(value):  # (no file name holds one)
            raise ConfigError(f"{locate(key, where)}{key} contains a NUL character; give a path or name")
        bounds = rules.get("between")
        if bounds is not None and number and not (rules.get("off_at_zero") and value == 0):
            low, high, what = bounds
            if not low <= value <= high:
                raise ConfigError(f"{locate(key, where)}{key} must be between {low:g} and {high:g} ({what}), "
                                  f"got {value:g}")
        if rules.get("threads"):  # (each a thread, or a process, of its own)
            check_threads(locate(key, where) + key, value)
    own = getattr(section, "check", None)
    if own is not None:
        own(At(prefix, where), root)


def per_worker(at: At, name: str, workers: int, count: int) -> None:
    """A count of threads each worker (or node) starts: ``ps.workers`` of them at most the limit."""
    key = at.key(name)
    check_threads(f"{at.origin(key)}ps.workers x {key} ({workers:,} x {count:,})", workers * count)


class YamlLoader(yaml.SafeLoader):
    """YAML as a config file means it: YAML 1.2's floats (``1e-5`` is a number, as in JSON and
    Python; YAML 1.1 reads it as a string) and no key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep)


YamlLoader.yaml_implicit_resolvers = {first: list(resolvers)  # a copy: SafeLoader's lists stay as they are
                                      for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def read_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=YamlLoader)


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value`` (the value read as YAML, as ``--set`` does) as (dotted key, value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = read_yaml_text(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    if not all(part.strip() for part in parts):
        raise ConfigError(f"{key!r} is not a config key (an empty part between dots)")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """(the mapping in the YAML file ``path``, where each dotted key of it is: ``file:line``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, where a config file was expected") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        node = yaml.compose(text, Loader=YamlLoader)
        data = read_yaml_text(text)
    except yaml.MarkedYAMLError as err:
        line = err.problem_mark.line + 1 if err.problem_mark else "?"
        raise ConfigError(f"{path}:{line}: invalid YAML: {err.problem}") from None
    except yaml.reader.ReaderError as err:  # a control character: the reader gives its position
        line = text[:err.position].count("\n") + 1
        raise ConfigError(f"{path}:{line}: invalid YAML: character {err.character:#x} is not allowed") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: a config file must be a mapping of keys to values")
    where: dict[str, str] = {}
    _record_lines(node, "", path, where)
    return data, where


def _record_lines(node: yaml.Node, prefix: str, path: Path, where: dict[str, str]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}"
        where[key] = f"{path}:{key_node.start_mark.line + 1}"
        _record_lines(value_node, key + ".", path, where)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys -> values."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


@contextlib.contextmanager
def user_terms(config: Any) -> Iterator[None]:
    """A ``ConfigError`` raised inside (a check after loading: a registry name, a task's own range)
    names the setting as the user gave it: the flag, ``--set`` item or file line of the first key
    its message mentions, instead of the internal key alone."""
    try:
        yield
    except ConfigError as err:
        located = locate_error(config, str(err))
        if located is None:
            raise
        raise ConfigError(located) from None


def locate_error(config: Any, message: str) -> str | None:
    """``message`` starting with where its first known key came from (the flag, ``--set`` item or
    ``file:line`` a loaded config recorded), or None where it names none or says so already."""
    where: dict[str, str] = getattr(config, "_where", {})
    found = []
    for key, origin in where.items():
        match = re.search(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w)", message)
        if match:
            found.append((match.start(), -len(key), key, origin))
    if not found:
        return None
    _, _, key, origin = min(found)
    if origin in message:
        return None
    if message.startswith(f"{key}: "):
        message = message[len(key) + 2:]
    return f"{origin}: {message}"
