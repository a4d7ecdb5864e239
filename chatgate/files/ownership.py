"""The gateway's file-ownership step (managed mode): a chat, Anthropic or Responses request may name only
files its key's team uploaded through chatgate (chatgate/files/owners.py). Every file id in the body counts,
wherever it is (chatgate/files/file_ids.py); a body that cannot be read whole is refused, never forwarded
unchecked."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, TypeVar

from chatgate.errors import APIError
from chatgate.files.file_ids import named_files
from chatgate.files.owners import foreign_file
from chatgate.store.base import FileOwnerStore

T = TypeVar("T")


class Runner(Protocol):
    """Runs work on a body where it costs the others least (chatgate/gateway/checking.py)."""

    async def run(self, size: int, work: Callable[[], T]) -> T: ...


class Team(Protocol):
    @property
    def team(self) -> str: ...


class FilesRequest(Protocol):
    """The request as the step sees it (chatgate/gateway/exchange.py)."""

    @property
    def body(self) -> bytes: ...

    @property
    def identity(self) -> Team: ...


class Ownership:
    def __init__(self, checkers: Runner, store: FileOwnerStore | None) -> None:
        self.checkers = checkers
        self.store = store  # who owns the uploaded files (None: no store, nothing to check against)

    async def foreign(self, ex: FilesRequest) -> tuple[bool, APIError | None]:
        """Whether the request names uploaded files (the account pool sends it to the account that holds
        them), and the error for the first one its team does not own, if any."""
        try:
            refs = await self.checkers.run(len(ex.body), functools.partial(named_files, ex.body))
        except APIError as error:
            return False, error
        if not refs or self.store is None:
            return bool(refs), None
        return True, await foreign_file(self.store, ex.identity.team, refs)
