"""What DeepSeek bills beyond a body's own bytes (issue 48): up to 384 tokens per image, and each document a
request names or carries. A budget's reservation counts them (chatgate/quotas/admission.py), and so does the
estimate of a request whose client hung up before DeepSeek's usage came.

Images are counted from the body's parse (chatgate/files/file_ids.py `body_media`), never by searching its
bytes. A document uploaded through chatgate counts what was counted at its upload
(chatgate/files/documents.py, kept with its owner); any other document (one chatgate did not see uploaded, one
whose parse size is not known, one sent in the body) counts at the model's context window, the most a request
can be billed."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from chatgate.files.file_ids import body_media
from chatgate.profiles import CONTEXT_1M, ModelProfile
from chatgate.store.base import FileOwnerStore, StoreError
from chatgate.verdict import Verdict

log = logging.getLogger("chatgate")
T = TypeVar("T")

IMAGE_TOKENS = 384  # DeepSeek's most per image (docs/rules-chat.md, R9)
DOCUMENT_OVERHEAD = 256  # the text DeepSeek may wrap a document in (its name, markers)
# A body without these bytes names no image and no document: its parse is not walked. `\u` because any
# letter of a key or a type may be escaped.
HINTS = (b"image", b"file", b"document", b"\\u")


class Runner(Protocol):
    async def run(self, size: int, work: Callable[[], T]) -> T: ...


class MediaRequest(Protocol):
    media_tokens: int | None

    @property
    def body(self) -> bytes: ...

    @property
    def model(self) -> str: ...


class MediaCounter:
    def __init__(self, checkers: Runner, store: FileOwnerStore | None,
                 profiles: dict[str, ModelProfile]) -> None:
        self.checkers = checkers
        self.store = store
        self.profiles = profiles

    @staticmethod
    def may_hold(ex: MediaRequest, verdict: Verdict | None) -> bool:
        """Whether the body may hold an image or a document (False: certainly none; a byte search)."""
        return (verdict is None or verdict.media) and any(hint in ex.body for hint in HINTS)

    async def tokens(self, ex: MediaRequest, verdict: Verdict | None) -> int:
        """The request's images' and documents' tokens at most (kept on the exchange: counted once)."""
        if ex.media_tokens is None:
            ex.media_tokens = await self._count(ex, verdict)
        return ex.media_tokens

    async def _count(self, ex: MediaRequest, verdict: Verdict | None) -> int:
        body = ex.body
        if not self.may_hold(ex, verdict):
            return 0
        media = await self.checkers.run(len(body), functools.partial(body_media, body))
        profile = verdict.profile if verdict is not None and verdict.profile is not None else \
            self.profiles.get(ex.model)
        window = profile.context_window if profile is not None else CONTEXT_1M
        documents = media.inline * window
        if media.files:
            counted = await self._counted(sorted(set(media.files)))
            for file_id in media.files:
                known = counted.get(file_id)
                documents += window if known is None else known + DOCUMENT_OVERHEAD
        return min(IMAGE_TOKENS * media.images + documents, window)

    async def _counted(self, file_ids: list[str]) -> dict[str, int | None]:
        if self.store is None:
            return {}
        try:
            return await asyncio.to_thread(self.store.file_tokens, file_ids)
        except StoreError as exc:  # counted at the window: more reserved, never less
            log.warning("could not read the token counts of %d uploaded files: %s", len(file_ids), exc)
            return {}
