"""The server's recent uploads, keyed by the SHA-256 of their bytes, so that a link can name an uploaded image
(issue 50). Bounded by bytes: the least recently used upload goes first, and a link to it then says so."""

from __future__ import annotations

import hashlib

from vit.cache import ByteCache

UPLOAD_STORE_BYTES = 256 * 2**20  # a few hundred photos; a link to an older one asks for the image again


def upload_digest(data: bytes) -> str:
    """The key of an upload in the store and in a link: the 64 hex digits of its SHA-256 (unguessable, so a link is
    what shares it)."""
    return hashlib.sha256(data).hexdigest()


class UploadStore:
    """Recent uploads' bytes, at most ``max_bytes`` in all, by ``upload_digest``; thread-safe (one per server)."""

    def __init__(self, max_bytes: int = UPLOAD_STORE_BYTES) -> None:
        self._cache = ByteCache(max_bytes)

    def put(self, data: bytes) -> str:
        """Keeps ``data`` (unless it alone exceeds the bound) and returns its digest."""
        digest = upload_digest(data)
        self._cache.get_or_compute(digest, lambda: bytes(data))
        return digest

    def get(self, digest: str) -> bytes | None:
        """The upload with this digest, or None when it is no longer (or never was) held."""
        return self._cache.get(digest)
