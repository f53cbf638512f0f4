"""The server's recent uploads, keyed by the SHA-256 of their bytes, so that a link can name an uploaded image
(issue 50), with the file name it was uploaded under so that the link's view names it. Bounded by bytes: the least
recently used upload goes first, and a link to it then says so."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from vit.core.cache import ByteCache

UPLOAD_STORE_BYTES = 256 * 2**20  # a few hundred photos; a link to an older one asks for the image again
MAX_NAME_CHARS = 255  # a file name's length on common file systems: a longer one is cut, not refused


@dataclass(frozen=True)
class Upload:
    """An upload held: its bytes and the file name it came with (untrusted text: show it as plain text)."""

    data: bytes
    name: str


def upload_digest(data: bytes) -> str:
    """The key of an upload in the store and in a link: the 64 hex digits of its SHA-256 (unguessable, so a link is
    what shares it)."""
    return hashlib.sha256(data).hexdigest()


class UploadStore:
    """Recent uploads' bytes, at most ``max_bytes`` in all, by ``upload_digest``; thread-safe (one per server)."""

    def __init__(self, max_bytes: int = UPLOAD_STORE_BYTES) -> None:
        self._cache = ByteCache(max_bytes)

    def put(self, data: bytes, name: str = "") -> str:
        """Keeps ``data`` and its file ``name`` (cut to ``MAX_NAME_CHARS``), unless they alone exceed the bound, and
        returns its digest. The same bytes under another name keep the name they were first uploaded under."""
        digest = upload_digest(data)
        self._cache.get_or_compute(digest, lambda: Upload(bytes(data), name[:MAX_NAME_CHARS]))
        return digest

    def upload(self, digest: str) -> Upload | None:
        """The upload with this digest, or None when it is no longer (or never was) held."""
        return self._cache.get(digest)

    def get(self, digest: str) -> bytes | None:
        """The bytes of the upload with this digest, or None when it is no longer (or never was) held."""
        found = self.upload(digest)
        return None if found is None else found.data
