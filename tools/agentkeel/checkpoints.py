"""Checkpoint payload encryption (G8, G9, G10), done in the client: the database stores
ciphertext and wrapped keys, never a plaintext payload or a usable key.

- Each tenant has data keys: random 256-bit keys, one active version at a time, stored in
  keel.tenant_data_keys only wrapped (AES-256-GCM) by a key provider's key, with the
  tenant id as associated data (a wrapped key copied to another tenant does not unwrap).
- Each payload is encrypted with AES-256-GCM under a data key version, a random 96-bit
  nonce, and associated data binding the tenant, task and checkpoint ids and the key
  version: a ciphertext moved to another row fails to decrypt.
- Destroying a tenant's data keys (keel.destroy_tenant_data_keys, G10) leaves only
  ciphertext no one can read.

A key provider is anything with ``key_id``, ``wrap`` and ``unwrap``; agentkeel ships one
that reads the key from an environment variable, one that reads it from a file, and a
keyring with a key per tenant that tenant deletion destroys (so that backups taken before
it cannot be read either). A KMS provider fits the same three members.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import secrets
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
DEFAULT_KEY_VARIABLE = "AGENTKEEL_CHECKPOINT_KEY"
_DATA_KEY_CONTEXT = b"agentkeel/tenant-data-key/v1\x00"
_PAYLOAD_CONTEXT = b"agentkeel/checkpoint-payload/v1\x00"


class CheckpointUnreadable(Exception):
    """A payload or data key failed to decrypt: altered, moved to another row or tenant,
    or wrapped by another provider key. Nothing is returned from it."""


class KeyProvider(Protocol):
    """Wraps and unwraps tenant data keys with a key the database never sees."""

    @property
    def key_id(self) -> str:
        """A name for the wrapping key (a fingerprint, never the key), stored with each
        wrapped data key."""
        ...

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """The data key encrypted and authenticated, bound to context."""
        ...

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """The data key; raises CheckpointUnreadable if wrapped or context was altered."""
        ...


def parse_key(text: str, source: str) -> bytes:
    """A 256-bit key written as 64 hex digits or as base64."""
    text = text.strip()
    key: bytes | None = None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        try:
            key = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            key = None
    if key is None or len(key) != KEY_BYTES:
        raise ValueError(
            f"{source}: a checkpoint key must be {KEY_BYTES} bytes, written as 64 hex digits "
            "or base64 (make one with: python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return key


class StaticKeyProvider:
    """A wrapping key held in memory: AES-256-GCM, nonce prepended to the ciphertext."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a wrapping key must be {KEY_BYTES} bytes")
        self._aead = AESGCM(key)
        digest = hashlib.sha256(b"agentkeel/key-id\x00" + key).hexdigest()
        self._key_id = f"aes256gcm:{digest[:16]}"

    @property
    def key_id(self) -> str:
        return self._key_id

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data_key, context)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], context)
        except InvalidTag as err:
            raise CheckpointUnreadable("the data key does not unwrap with this key") from err


class EnvKeyProvider(StaticKeyProvider):
    """The wrapping key from an environment variable (hex or base64)."""

    def __init__(self, variable: str = DEFAULT_KEY_VARIABLE) -> None:
        value = os.environ.get(variable)
        if not value:
            raise ValueError(f"${variable} is not set: it must hold the checkpoint key")
        super().__init__(parse_key(value, f"${variable}"))


class FileKeyProvider(StaticKeyProvider):
    """The wrapping key from a file (hex or base64) that only its owner may read."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"{path}: a key file must not be readable by others (chmod 600)")
        super().__init__(parse_key(path.read_text(encoding="ascii"), str(path)))


class KeyringKeyProvider:
    """A wrapping key per tenant, each in a file of its own in a directory that only its
    owner may read and that the database never sees. destroy_tenant(tenant) erases the
    tenant's file, after which no copy of its wrapped data keys anywhere (a backup, a
    replica, a dump restored elsewhere) unwraps: what crypto-shredding needs to reach
    copies (G10). With one wrapping key for every tenant (StaticKeyProvider and its kin),
    a backup taken before a deletion holds wrapped keys that key still opens. A KMS with a
    key per tenant fits the same shape.

    Every worker that saves or loads checkpoints, and `agentkeel tenant delete --keyring`,
    use the same directory (one volume they all mount; copies would each make their own
    key for a new tenant). A tenant's key is made on its first wrap, never by an unwrap.
    create=False opens an existing keyring only (`tenant delete` does, so that a mistyped
    path is an error rather than an empty keyring)."""

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True) -> None:
        self._dir = Path(directory)
        if not create and not (self._dir / "keyring.id").is_file():
            raise ValueError(f"{self._dir}: not a checkpoint keyring (no keyring.id in it)")
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self._dir.stat()
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"{self._dir}: a keyring must not be open to others (chmod 700)")
        if info.st_uid != os.geteuid():
            raise ValueError(f"{self._dir}: a keyring must belong to the user that uses it")
        # The keyring's name, stored with each wrapped data key: made once, kept in the
        # directory, so every process using this keyring reports the same key_id.
        self._key_id = "keyring:" + self._read_or_make("keyring.id", secrets.token_hex(8)).strip()

    @property
    def key_id(self) -> str:
        return self._key_id

    def _path(self, tenant_id: uuid.UUID) -> Path:
        return self._dir / f"{tenant_id}.key"

    def _read(self, path: Path) -> str | None:
        """The file's text; None when there is none. Never follows a symlink, and refuses
        a file others may read."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "r", encoding="ascii") as f:
            if os.fstat(f.fileno()).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ValueError(f"{path}: a key file must not be readable by others (chmod 600)")
            return f.read()

    def _read_or_make(self, name: str, content: str) -> str:
        """The file's text; made first with content (atomically: a racing process reads
        the one that won) when it does not exist."""
        path = self._dir / name
        text = self._read(path)
        if text is not None:
            return text
        fd, temporary = tempfile.mkstemp(dir=self._dir, prefix=".new-")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(content)
            os.chmod(temporary, 0o600)
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            os.unlink(temporary)
        text = self._read(path)
        if text is None:  # destroyed between the link and the read
            raise CheckpointUnreadable(f"{path} was destroyed while it was made")
        return text

    @staticmethod
    def _tenant(context: bytes) -> uuid.UUID:
        if not context.startswith(_DATA_KEY_CONTEXT) or len(context) != len(_DATA_KEY_CONTEXT) + 16:
            raise ValueError("a keyring wraps tenant data keys only (data_key_context)")
        return uuid.UUID(bytes=context[len(_DATA_KEY_CONTEXT) :])

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        path = self._path(self._tenant(context))
        text = self._read_or_make(path.name, secrets.token_hex(KEY_BYTES))
        return StaticKeyProvider(parse_key(text, str(path))).wrap(data_key, context)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        tenant_id = self._tenant(context)
        path = self._path(tenant_id)
        try:
            text = self._read(path)
            key = None if text is None else parse_key(text, str(path))
        except ValueError as err:  # a key being destroyed (zeroed) reads as no key
            raise CheckpointUnreadable(
                f"tenant {tenant_id}'s wrapping key is unreadable: {err}"
            ) from err
        if key is None:
            raise CheckpointUnreadable(
                f"tenant {tenant_id}'s wrapping key is not in the keyring: destroyed when the "
                "tenant was deleted (G10), or another keyring"
            )
        return StaticKeyProvider(key).unwrap(wrapped, context)

    def destroy_tenant(self, tenant_id: uuid.UUID) -> bool:
        """Erase the tenant's wrapping key (overwritten, then removed); False if there was
        none. Every data key it wrapped, wherever a copy is, is unreadable from then on. A
        later wrap for the tenant (a worker still running for it) makes a new key, which
        wraps nothing the deleted tenant had."""
        path = self._path(tenant_id)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        with os.fdopen(fd, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
        path.unlink()
        return True


def new_data_key() -> bytes:
    """A fresh random 256-bit tenant data key."""
    return secrets.token_bytes(KEY_BYTES)


def data_key_context(tenant_id: uuid.UUID) -> bytes:
    """Associated data of a wrapped data key: it unwraps only for its own tenant."""
    return _DATA_KEY_CONTEXT + tenant_id.bytes


def payload_context(
    tenant_id: uuid.UUID, task_id: uuid.UUID, checkpoint_id: uuid.UUID, key_version: int
) -> bytes:
    """Associated data of a payload: its tenant, task, checkpoint and key version."""
    return (
        _PAYLOAD_CONTEXT
        + tenant_id.bytes
        + task_id.bytes
        + checkpoint_id.bytes
        + key_version.to_bytes(4, "big")
    )


@dataclass(frozen=True)
class Sealed:
    """An encrypted payload as keel.save_checkpoint stores it."""

    key_version: int
    nonce: bytes
    ciphertext: bytes

    @property
    def payload_hash(self) -> str:
        """sha256 hex of the ciphertext (never of the plaintext, which would let a reader of
        the table confirm a guess)."""
        return hashlib.sha256(self.ciphertext).hexdigest()


def seal(data_key: bytes, key_version: int, context: bytes, plaintext: bytes) -> Sealed:
    nonce = os.urandom(NONCE_BYTES)
    return Sealed(key_version, nonce, AESGCM(data_key).encrypt(nonce, plaintext, context))


def unseal(data_key: bytes, sealed: Sealed, context: bytes) -> bytes:
    try:
        return AESGCM(data_key).decrypt(sealed.nonce, sealed.ciphertext, context)
    except InvalidTag as err:
        raise CheckpointUnreadable(
            "the checkpoint payload does not decrypt: it was altered, or belongs to another "
            "row (the tenant, task and checkpoint ids are bound to it)"
        ) from err


def uuid7() -> uuid.UUID:
    """A time-ordered (version 7) uuid, as keel.uuid_v7() makes in the database."""
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 9562 variant
    return uuid.UUID(int=value)
