"""The wheels `shoal deploy` pushes, built without a network: shoal from its own source tree
(version `X+g<hash>` so a changed tree is an upgrade), and with `offline` every dependency
repacked from the files this environment installed (so a target must match its Python version
and platform, as pip checks from the wheel tags).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from node.errors import DeployError

PROJECT = "shoal"
PACKAGES = ("config", "net", "wal", "health", "sync", "node", "shoal")
_SOURCE_SUFFIXES = (
    ".py",
    ".typed",
    ".yaml",
    ".service",
    ".json",
    ".html",
    ".js",
    ".css",
    ".ico",
    ".svg",
    ".png",
)
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)  # fixed, so the same files make the same bytes
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class Wheel:
    """A wheel file on this machine and the sha256 of its bytes."""

    path: Path
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(path: Path, files: dict[str, bytes], dist_info: str) -> Wheel:
    """Write `files` (archive name -> bytes) as a wheel with a fresh RECORD under `dist_info`."""
    record_name = f"{dist_info}/RECORD"
    lines = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(files.items())]
    lines.append(f"{record_name},,")
    entries = {**files, record_name: ("\n".join(lines) + "\n").encode()}
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(temp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, entries[name])
    temp.replace(path)
    return Wheel(path, hashlib.sha256(path.read_bytes()).hexdigest())


def source_root() -> Path:
    """The source tree of the running shoal (the folder holding its packages)."""
    root = Path(__file__).resolve().parents[2]
    if not all((root / package / "__init__.py").is_file() for package in PACKAGES):
        raise DeployError(f"{root}: not a shoal source tree (missing one of {PACKAGES})")
    return root


def _source_files(root: Path) -> dict[str, bytes]:
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in _SOURCE_SUFFIXES:
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def build_shoal_wheel(cache_dir: Path) -> Wheel:
    """The wheel of the running shoal's source, reused from `cache_dir` when the tree is the
    same (its version carries the tree's hash)."""
    root = source_root()
    files = _source_files(root)
    tree = hashlib.sha256()
    for name, data in sorted(files.items()):
        tree.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    installed = metadata.distribution(PROJECT)
    version = f"{installed.version.split('+')[0]}+g{tree.hexdigest()[:12]}"
    path = cache_dir / f"{PROJECT}-{version}-py3-none-any.whl"
    if path.is_file():
        return Wheel(path, hashlib.sha256(path.read_bytes()).hexdigest())
    dist_info = f"{PROJECT}-{version}.dist-info"
    meta = installed.read_text("METADATA") or installed.read_text("PKG-INFO")
    if not meta:
        raise DeployError(f"{PROJECT}: its installed metadata is missing; reinstall shoal")
    meta = re.sub(r"^Version: .*$", f"Version: {version}", meta, count=1, flags=re.MULTILINE)
    files[f"{dist_info}/METADATA"] = meta.encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: shoal-deploy\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    entry_points = installed.read_text("entry_points.txt")
    if entry_points:
        files[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    return write_wheel(path, files, dist_info)


def dependency_names(project: str = PROJECT) -> list[str]:
    """The installed distributions `project` needs, transitively (extras left out, and
    requirements whose distribution is not installed here, as their markers exclude them)."""
    seen: dict[str, str] = {}
    todo = [project]
    while todo:
        name = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = _normalize(dist.metadata["Name"])
        if key in seen:
            continue
        seen[key] = dist.metadata["Name"]
        for requirement in dist.requires or []:
            if "extra ==" in requirement.replace("extra==", "extra =="):
                continue
            match = _NAME.match(requirement)
            if match:
                todo.append(match.group(1))
    seen.pop(_normalize(project), None)
    return sorted(seen.values(), key=str.lower)


def compressed_tag(tags: Iterable[str]) -> str:
    """The file-name tag of a wheel's `Tag:` lines (`py2-none-any`, `py3-none-any` ->
    `py2.py3-none-any`)."""
    parts: list[list[str]] = [[], [], []]
    for tag in tags:
        for index, part in enumerate(tag.split("-", 2)):
            if part not in parts[index]:
                parts[index].append(part)
    return "-".join(".".join(part) for part in parts)


def repack_installed(name: str, out_dir: Path) -> Wheel:
    """A wheel of distribution `name` made from the files installed here (its RECORD)."""
    dist = metadata.distribution(name)
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    if not tags:
        raise DeployError(f"{name}: installed without wheel tags; cannot repack it for --offline")
    version = dist.version
    stem = f"{_normalize(dist.metadata['Name'])}-{version}"
    path = out_dir / f"{stem}-{compressed_tag(tags)}.whl"
    if path.is_file():
        return Wheel(path, hashlib.sha256(path.read_bytes()).hexdigest())
    dist_info = None
    files: dict[str, bytes] = {}
    for entry in dist.files or []:
        relative = entry.as_posix()
        if relative.startswith("..") or "__pycache__" in relative or relative.endswith(".pyc"):
            continue
        if relative.endswith(".dist-info/RECORD") or relative.endswith(
            (".dist-info/INSTALLER", ".dist-info/REQUESTED", ".dist-info/direct_url.json")
        ):
            dist_info = relative.split("/", 1)[0] if relative.endswith("RECORD") else dist_info
            continue
        located = Path(str(dist.locate_file(entry)))
        if located.is_file():
            files[relative] = located.read_bytes()
    if dist_info is None:
        raise DeployError(f"{name}: no RECORD among its installed files; cannot repack it")
    return write_wheel(path, files, dist_info)


def dependency_wheels(out_dir: Path, names: Iterable[str] | None = None) -> list[Wheel]:
    """Wheels of every dependency of shoal, repacked from this environment into `out_dir`."""
    return [repack_installed(name, out_dir) for name in (names or dependency_names())]
