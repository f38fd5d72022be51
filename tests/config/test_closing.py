"""AsyncClosing: `async with` gives the object itself and closes it however the block ends."""

from __future__ import annotations

import pytest

from config import AsyncClosing


class Resource(AsyncClosing):
    def __init__(self) -> None:
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


async def test_closes_after_the_block_and_after_an_error() -> None:
    resource = Resource()
    async with resource as same:
        assert same is resource
        assert resource.closed == 0
    assert resource.closed == 1
    with pytest.raises(KeyError):
        async with resource:
            raise KeyError("boom")
    assert resource.closed == 2


async def test_a_subclass_without_close_says_so() -> None:
    class Forgot(AsyncClosing):
        pass

    with pytest.raises(NotImplementedError, match="Forgot must implement close"):
        async with Forgot():
            pass
