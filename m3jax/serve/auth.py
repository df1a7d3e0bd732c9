"""API keys: only SHA-256 digests are stored (file or environment); each key maps to one tenant.

WHY plain SHA-256 and not a slow password hash: keys are 256-bit random tokens made by `new_key`, so there is
nothing to brute-force; a fast digest keeps per-request checks cheap. Comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pathlib
import re
import secrets

_TENANT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HEX_RE = re.compile(r"^[0-9a-f]{64}$")


class AuthConfigError(ValueError):
  """A malformed key file or key environment variable."""


def hash_key(key: str) -> str:
  return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
  return "m3k_" + secrets.token_urlsafe(32)


def _parse(entries: list[str], where: str) -> dict[str, str]:
  out: dict[str, str] = {}
  for i, raw in enumerate(entries):
    line = raw.strip()
    if not line or line.startswith("#"):
      continue
    tenant, sep, digest = line.partition(":")
    if not sep or not _TENANT_RE.match(tenant) or not _HEX_RE.match(digest):
      raise AuthConfigError(f"{where} entry {i + 1} is not `tenant:sha256hex` (got {line[:40]!r})")
    out[digest] = tenant
  return out


class KeyRing:
  """digest -> tenant, from `keys_file` and the `keys_env` environment variable."""

  def __init__(self, digests: dict[str, str]):
    self._digests = dict(digests)

  @classmethod
  def load(cls, keys_file: str, keys_env: str) -> "KeyRing":
    digests: dict[str, str] = {}
    if keys_file:
      path = pathlib.Path(keys_file)
      if not path.is_file():
        raise AuthConfigError(f"keys file {path} does not exist (create keys with `serve.py add-key TENANT`)")
      digests.update(_parse(path.read_text().splitlines(), str(path)))
    if keys_env and os.environ.get(keys_env):
      digests.update(_parse(os.environ[keys_env].split(","), f"${keys_env}"))
    return cls(digests)

  def tenant_of(self, key: str | None) -> str | None:
    if not key:
      return None
    digest = hash_key(key)
    for known, tenant in self._digests.items():
      if hmac.compare_digest(known, digest):
        return tenant
    return None

  def __len__(self) -> int:
    return len(self._digests)


def add_key(keys_file: str, tenant: str) -> str:
  """Appends a fresh key's digest for `tenant` to `keys_file`; returns the key (shown once, never stored)."""
  if not _TENANT_RE.match(tenant):
    raise AuthConfigError(f"tenant name {tenant!r} must match {_TENANT_RE.pattern}")
  key = new_key()
  path = pathlib.Path(keys_file)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a") as f:
    f.write(f"{tenant}:{hash_key(key)}\n")
    f.flush()
    os.fsync(f.fileno())
  os.chmod(path, 0o600)
  return key
