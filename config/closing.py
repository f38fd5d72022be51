"""The async context manager of objects that own resources and release them in `close()`."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClosing:
    """`async with obj as same:` awaits `obj._enter()`, gives `obj` and awaits `obj.close()` on the
    way out, however the block ends. Subclasses implement `close()` (idempotent by convention)."""

    __slots__ = ()

    async def close(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement close()")

    async def _enter(self) -> None:
        """What `async with` does before its block (open or start); nothing by default."""

    async def __aenter__(self) -> Self:
        await self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
