"""RecordStores: the record stores of one node (built-ins plus configured ones), opened together.

The daemon owns one; it is a read-only mapping of store name to open RecordStore.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from config import Category, NodeSettings
from config.closing import AsyncClosing
from health import DiskWrites
from sync.errors import RecordSchemaError, StoreClosedError
from sync.records.schema import BUILTIN_SCHEMAS, RecordSchema
from sync.records.store import RecordStore
from sync.records.types import StoreOptions

logger = logging.getLogger(__name__)


def store_path(data_dir: Path, name: str, category_dirs: Mapping[str, Path]) -> Path:
    """`<category dir>/<name>.db`; a store that is not a category lives in data_dir/records."""
    directory = category_dirs.get(name)
    if directory is None:
        directory = Path(data_dir) / "records"
    return Path(directory) / f"{name}.db"


class RecordStores(Mapping[str, RecordStore], AsyncClosing):
    """Owns one RecordStore per schema; empty until opened, empty again after close()."""

    def __init__(
        self,
        data_dir: Path,
        extra_schemas: Sequence[RecordSchema] = (),
        options: StoreOptions | None = None,
        category_dirs: Mapping[str, Path] | None = None,
        writes: DiskWrites | None = None,
    ) -> None:
        """`writes` hears of every store's failed and succeeded commits (disk health)."""
        self._writes = writes
        schemas = dict(BUILTIN_SCHEMAS)
        for schema in extra_schemas:
            if schema.name in schemas:
                raise RecordSchemaError(f"record store {schema.name!r} is declared twice")
            schemas[schema.name] = schema
        if category_dirs is None:
            category_dirs = {c.value: Path(data_dir) / c.value for c in Category}
        self._planned = {
            name: (store_path(data_dir, name, category_dirs), schema)
            for name, schema in sorted(schemas.items())
        }
        self._options = options or StoreOptions()
        self._stores: dict[str, RecordStore] = {}
        self._state = "unopened"

    @classmethod
    def for_settings(
        cls,
        settings: NodeSettings,
        extra_schemas: Sequence[RecordSchema] = (),
        options: StoreOptions | None = None,
        writes: DiskWrites | None = None,
    ) -> RecordStores:
        """Stores at settings.category_path(store) / f"{store}.db", busy timeout from config."""
        base = options or StoreOptions()
        options = replace(base, busy_timeout_s=settings.timeouts.sqlite_busy_s)
        dirs = {c.value: settings.category_path(c) for c in Category}
        return cls(settings.data_dir, extra_schemas, options, dirs, writes)

    @property
    def paths(self) -> dict[str, Path]:
        """Where each store's database lives."""
        return {name: path for name, (path, _) in self._planned.items()}

    def __getitem__(self, name: str) -> RecordStore:
        return self._stores[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._stores)

    def __len__(self) -> int:
        return len(self._stores)

    async def open(self) -> None:
        """Open every store; if one fails, close those opened and raise its error."""
        if self._state != "unopened":
            raise StoreClosedError(f"record stores were already {self._state}")
        self._state = "open"
        try:
            for name, (path, schema) in self._planned.items():
                store = RecordStore(path, schema, self._options, self._writes)
                await store.open()
                self._stores[name] = store
        except BaseException:
            await asyncio.shield(self.close())
            raise

    async def close(self) -> None:
        """Close every store, last opened first (each refuses new work with 503 meanwhile).

        Idempotent; the mapping is empty afterwards.
        """
        self._state = "closed"
        for name, store in reversed(list(self._stores.items())):
            try:
                await store.close()
            except Exception:
                logger.exception("record store %s failed to close", name)
        self._stores.clear()

    async def _enter(self) -> None:
        await self.open()

    async def cleanup_ctx(self, app: Any) -> AsyncIterator[None]:
        """For `app.cleanup_ctx.append(stores.cleanup_ctx)`: open at startup, close at cleanup."""
        await self.open()
        try:
            yield
        finally:
            await self.close()
