"""The file categories of a node (models, training, configs): their directories, manifest
caches, storage providers and shared-storage identities, for the routes and the coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from config import Category, DeletionPolicy, NodeSettings
from config.settings import DEFAULT_TOMBSTONE_TTL_S
from sync.files.errors import FileSyncError, UnknownCategoryError
from sync.files.manifest import (
    DEFAULT_PIECE_SIZE,
    ManifestEntry,
    check_piece_size,
    digest_of_fd,
)
from sync.files.manifest_cache import Hasher, Listing, ManifestCache
from sync.files.tombstones import Clock, Tombstone, TombstoneStore
from sync.storage import (
    MountInfo,
    StorageKind,
    StorageProvider,
    detect_storage,
    provider_of,
    shared_id,
)

logger = logging.getLogger(__name__)

FILE_CATEGORIES: tuple[str, ...] = (
    Category.MODELS.value,
    Category.TRAINING.value,
    Category.CONFIGS.value,
)

CHECKPOINTS = "checkpoints"
"""The training checkpoints (settings.checkpoint_dir): in every node's catalog, so the file and
piece routes serve them and the coordinator fetches them verified, but never pulled by the
background sync: node.checkpoints decides which node copies which files."""


def _really_gone(root: Path, entries: list[ManifestEntry]) -> list[ManifestEntry]:
    """The entries whose file is absent (not merely unlistable: a directory without read
    permission, or an unmounted root, is no deletion). Blocking."""
    if not root.is_dir():
        return []
    gone: list[ManifestEntry] = []
    for entry in entries:
        try:
            root.joinpath(*entry.path.split("/")).lstat()
        except FileNotFoundError:
            gone.append(entry)
        except OSError as exc:
            logger.debug("%s/%s not listed (%s): not a deletion", root, entry.path, exc)
    return gone


class FileCatalog:
    """Owns the manifest cache of every file category (async context manager; close() is
    idempotent). Cache files live in `cache_dir`, never inside a category directory.

    A first manifest page is cut from a listing at most `listing_fresh_s` old, or
    `scan_interval_factor` times as old as that listing took to make (so serving manifests to
    many peers spends at most about 1/factor of the time scanning); later pages of the same
    walk come from the listing the first one used while it is under `cursor_ttl_s`.

    `deletions` names the categories whose deletions propagate (`propagate`; any other
    category keeps): a file found gone from one of them leaves a tombstone (by `node_id`),
    kept `tombstone_ttl_s` in `tombstones` and served with its manifest.
    """

    def __init__(
        self,
        roots: Mapping[str, Path],
        cache_dir: Path,
        *,
        piece_size: int = DEFAULT_PIECE_SIZE,
        mounts: Sequence[MountInfo] | None = None,
        hasher: Hasher = digest_of_fd,
        listing_fresh_s: float = 1.0,
        scan_interval_factor: float = 10.0,
        cursor_ttl_s: float = 300.0,
        deletions: Mapping[str, DeletionPolicy] | None = None,
        node_id: str = "",
        tombstone_ttl_s: float = DEFAULT_TOMBSTONE_TTL_S,
        clock: Clock = time.time_ns,
    ) -> None:
        self.piece_size = check_piece_size(piece_size)
        self.cache_dir = Path(cache_dir)
        self.node_id = node_id
        self._roots = {category: Path(root) for category, root in roots.items()}
        self._propagating = frozenset(
            category
            for category, policy in (deletions or {}).items()
            if policy == "propagate" and category in self._roots
        )
        self.tombstones: TombstoneStore | None = (
            TombstoneStore(self.cache_dir / "tombstones.db", tombstone_ttl_s, clock=clock)
            if self._propagating
            else None
        )
        self._mounts = mounts
        self._listing_fresh_s = listing_fresh_s
        self._scan_interval_factor = scan_interval_factor
        self._cursor_ttl_s = cursor_ttl_s
        self._caches = {
            category: ManifestCache(
                root,
                self.cache_dir / f"manifest-{category}.db",
                piece_size,
                hasher=hasher,
                on_removed=functools.partial(self._removed, category)
                if category in self._propagating
                else None,
            )
            for category, root in self._roots.items()
        }
        self._providers: list[StorageProvider] = []
        self._shared_ids: dict[str, str | None] = {}
        self._opened = False
        self._closed = False

    @classmethod
    def for_settings(cls, settings: NodeSettings, **options: object) -> FileCatalog:
        """The catalog of a node: its three file categories and its checkpoints, caches in
        data_dir/sync, each file category's deletion policy and the tombstone TTL."""
        roots = {category: settings.category_path(category) for category in FILE_CATEGORIES}
        options.setdefault(
            "deletions", {category: settings.deletion_policy(category) for category in roots}
        )
        roots[CHECKPOINTS] = settings.checkpoint_dir
        options.setdefault("tombstone_ttl_s", settings.tombstone_ttl_s)
        return cls(roots, settings.data_dir / "sync", **options)  # type: ignore[arg-type]

    async def __aenter__(self) -> FileCatalog:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open every cache, detect the storage of each category and mark shared storage."""
        if self._opened:
            raise FileSyncError("file catalog was already opened")
        self._opened = True
        try:
            if self.tombstones is not None:
                await self.tombstones.open()
            for cache in self._caches.values():
                await cache.open()
            self._providers = await asyncio.to_thread(detect_storage, self._roots, self._mounts)
            for category, root in self._roots.items():
                provider = provider_of(self._providers, category)
                self._shared_ids[category] = await asyncio.to_thread(shared_id, provider, root)
                if provider is not None and provider.kind is StorageKind.EPHEMERAL:
                    logger.warning(
                        "category %s at %s is on %s (%s): its files are lost on restart",
                        category,
                        root,
                        provider.mount.fs_type,
                        provider.kind.value,
                    )
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close every cache; idempotent."""
        if self._closed:
            return
        self._closed = True
        for cache in self._caches.values():
            with contextlib.suppress(FileSyncError):
                await cache.close()
        if self.tombstones is not None:
            await self.tombstones.close()

    async def _removed(self, category: str, entries: list[ManifestEntry]) -> None:
        """Files of a propagating category found gone: their tombstones, durably, before the
        manifest cache forgets them (a crash in between finds them gone again)."""
        assert self.tombstones is not None
        root = self._roots[category]
        gone = await asyncio.to_thread(_really_gone, root, entries)
        made = await self.tombstones.record_removed(category, gone, self.node_id)
        if made:
            logger.info(
                "%d file(s) of %s deleted here, tombstones recorded: %s%s",
                len(made),
                category,
                ", ".join(tomb.path for tomb in made[:5]),
                ", ..." if len(made) > 5 else "",
            )

    def propagates(self, category: str) -> bool:
        """True when deletions of `category` propagate (tombstones), False when they are kept."""
        self.root(category)
        return category in self._propagating

    def served_tombstones(self, category: str) -> tuple[Tombstone, ...]:
        """The live tombstones served with the manifest of `category` (none when it keeps)."""
        if self.tombstones is None or not self.propagates(category):
            return ()
        return self.tombstones.live(category)

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(self._roots)

    @property
    def providers(self) -> list[StorageProvider]:
        return list(self._providers)

    def root(self, category: str) -> Path:
        """The directory of `category`; UnknownCategoryError when it is not a file category."""
        try:
            return self._roots[category]
        except KeyError:
            raise UnknownCategoryError(category) from None

    def cache(self, category: str) -> ManifestCache:
        try:
            return self._caches[category]
        except KeyError:
            raise UnknownCategoryError(category) from None

    def provider(self, category: str) -> StorageProvider | None:
        return provider_of(self._providers, category)

    def shared_id(self, category: str) -> str | None:
        """Identity of the shared storage `category` lives on; None when not shared."""
        self.root(category)
        return self._shared_ids.get(category)

    def deletion_summary(self) -> dict[str, dict[str, str | int]]:
        """Per category: its deletion policy (`propagate` or `keep`) and how many live
        tombstones it serves."""
        return {
            category: {
                "policy": "propagate" if self.propagates(category) else "keep",
                "tombstones": len(self.served_tombstones(category)),
            }
            for category in self.categories
        }

    async def listing(self, category: str, max_age_s: float = 0.0) -> Listing:
        """Every file of `category` (see ManifestCache.listing)."""
        return await self.cache(category).listing(max_age_s)

    async def listing_for_page(self, category: str, after: str | None) -> Listing:
        """The listing a manifest page is cut from (see the class docstring)."""
        cache = self.cache(category)
        previous = cache.last_listing
        if (
            after is not None
            and previous is not None
            and time.monotonic() - previous.taken_at < self._cursor_ttl_s
        ):
            return previous
        max_age_s = self._listing_fresh_s
        if previous is not None:
            max_age_s = max(max_age_s, previous.scan_s * self._scan_interval_factor)
        return await cache.listing(max_age_s)
