"""The tuner's persistent cache (`TuneCache`): each answer in a JSON file keyed by the GPU, its
driver, the CUDA and nvcc versions, the hash of the kernel's source (the ``.cu`` file and what it
includes: `helpers.compile.source_hash`), the variant and the problem. Writers merge under a lock
file through a temporary file; a damaged file or entry is one `TuneCacheWarning`, never an error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

from filelock import FileLock

from .. import gpu
from ..compile import nvcc_version, source_hash
from ..problem import Conv2dProblem
from ..variants import Variant
from .space import SPACES

CACHE_ENV = "CONV2D_DAYS_TUNE_CACHE"  # overrides `default_cache_path`
CACHED = ("config", "ms", "rule_config", "rule_ms", "model_rank")  # what a cache entry answers with


def environment() -> dict:
    """{gpu, driver, cuda, nvcc}: what a tuned answer or a measured machine depends on besides its
    kernel's source (`helpers.gpu.versions`, `helpers.compile.nvcc_version`); ``"none"`` fields
    without a GPU or nvcc."""
    v = gpu.versions()
    return {"gpu": v["gpu"], "driver": v["driver"], "cuda": v["cuda"], "nvcc": nvcc_version()}


def replace_json(path: Path, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file of its own beside it, then
    replace the file (atomic: a reader sees the old file or the new one), keeping the file's
    permission bits. The caller holds the file's lock when it merges."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600: keep a shared cache readable
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def default_cache_path() -> Path:
    """``$CONV2D_DAYS_TUNE_CACHE`` if set, else ``~/.cache/conv2d-days/tune.json``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "conv2d-days" / "tune.json"


@functools.lru_cache(maxsize=4096)
def problem_key(p: Conv2dProblem) -> str:
    """The problem's compared fields (not its label) as a compact string."""
    d = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.compare}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


class TuneCacheWarning(UserWarning):
    """A tune cache file, or an entry of it, that cannot be used: the rule's choice runs instead."""


def _warn(message: str) -> None:
    warnings.warn(message, TuneCacheWarning, stacklevel=3)


def valid_entry(entry) -> bool:
    """Whether a cache entry holds what a hit answers with (`CACHED`): ``config`` and
    ``rule_config`` strings, ``ms`` and ``rule_ms`` numbers, ``model_rank`` an int."""
    if not isinstance(entry, dict) or not all(k in entry for k in CACHED):
        return False
    numbers = all(isinstance(entry[k], (int, float)) and not isinstance(entry[k], bool) for k in ("ms", "rule_ms"))
    return (numbers and isinstance(entry["config"], str) and isinstance(entry["rule_config"], str)
            and isinstance(entry["model_rank"], int))


def _file_mode(path: Path) -> int:
    """The permission bits ``path`` has, or a new file's under the process's umask (0666 & ~umask)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


class TuneCache:
    """Tuned choices in a JSON file: {key: entry}, written after every new entry.

    The key (`key`) joins the environment (GPU, driver, CUDA, nvcc), the kernel's source hash, the
    variant and the problem, so anything that could change the answer changes the key; old keys
    are simply never asked again. An entry holds the configuration, its time (ms) and how it was
    found.

    Several processes may tune into one file: `store` holds a lock file beside it
    (``<name>.lock``, `filelock`), merges its entry into what is on disk and replaces the file
    through a temporary file of its own, so no entry is lost and a reader never sees half a file.
    A file that is not a JSON object, or entries that are malformed (`valid_entry`), are left out
    with one `TuneCacheWarning` naming the file: those problems run the rule's choice.
    """

    def __init__(self, path: str | Path | None = None, environment: dict | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self._env = environment
        self._prefixes: dict = {}  # (variant name, source hash) -> the key's first six fields
        self._checked: set = set()  # (key, configuration) stored here after `check_winner` passed it
        self.entries: dict = self._read(warn=True)

    def _read(self, warn: bool) -> dict:
        """The valid entries on disk ({} without a file); with ``warn``, one warning for a file or
        entries that cannot be used."""
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            if warn:
                _warn(f"tune cache {self.path} is unreadable ({type(e).__name__}: {e}): the rule's choices run; "
                      "the next store rewrites it")
            return {}
        if not isinstance(data, dict):
            if warn:
                _warn(f"tune cache {self.path} holds a JSON {type(data).__name__}, not an object of entries: "
                      "the rule's choices run; the next store rewrites it")
            return {}
        good = {k: e for k, e in data.items() if valid_entry(e)}
        if warn and len(good) < len(data):
            _warn(f"tune cache {self.path}: {len(data) - len(good)} malformed entries left out (their problems run "
                  f"the rule's choice); an entry needs {', '.join(CACHED)}")
        return good

    @property
    def environment(self) -> dict:
        """{gpu, driver, cuda, nvcc}: `environment`, asked once per cache object."""
        if self._env is None:
            self._env = environment()
        return self._env

    def key(self, variant: Variant, p: Conv2dProblem) -> str:
        """``gpu|driver|cuda|nvcc|source|variant|problem``: the environment and source part made once
        per (variant, `helpers.compile.source_hash`), which costs a few ``stat`` calls per lookup.
        The source is the hash of the variant's ``cu_file``, or, for a variant whose search space
        names more kernel files (`helpers.tune.Space.sources`), a hash of all their hashes."""
        files = (variant.cu_file, *(SPACES[variant.name].sources if variant.name in SPACES else ()))
        hashes = [source_hash(f) for f in files]
        part = (variant.name, hashes[0] if len(hashes) == 1 else hashlib.sha256("".join(hashes).encode()).hexdigest())
        prefix = self._prefixes.get(part)
        if prefix is None:
            env = self.environment
            prefix = self._prefixes[part] = "|".join([env["gpu"], env["driver"], env["cuda"], env["nvcc"],
                                                      part[1][:16], variant.name])
        return f"{prefix}|{problem_key(p)}"

    def checked(self, variant: Variant, p: Conv2dProblem, config: str) -> bool:
        """Whether this object stored ``config`` for (variant, problem) after `check_winner` passed it."""
        return (self.key(variant, p), config) in self._checked

    def lookup(self, variant: Variant, p: Conv2dProblem) -> dict | None:
        """The entry for (variant, problem) in this environment and source, or None."""
        return self.entries.get(self.key(variant, p))

    def store(self, variant: Variant, p: Conv2dProblem, entry: dict, checked: bool = False) -> None:
        """Add ``entry`` for (variant, problem) to the file, merged with what other processes
        stored since (under the lock), and take their entries in too; ``checked``: its
        configuration passed `check_winner` (`checked` answers so in this process).

        Raises:
            ValueError: ``entry`` is not a `valid_entry`.
        """
        if not valid_entry(entry):
            raise ValueError(f"a tune cache entry needs {', '.join(CACHED)} (strings, numbers); got {entry!r}")
        key = self.key(variant, p)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            merged = {**self._read(warn=False), key: entry}
            replace_json(self.path, merged)
        self.entries = merged
        if checked:
            self._checked.add((key, entry["config"]))
