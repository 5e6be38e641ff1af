"""Unix account names for hub names, and the record that says whose an account is.

A hub name made only of ``[a-z0-9-]`` that fits is used as it is
(``gpulab-alice``). Any other name (``_``, ``.``, unicode, too long) becomes
``<prefix><safe characters>_<hash>``: the hash is base32 of the name's SHA-256
and takes at least :data:`HASH_CHARS` characters (120 bits) of the 32 Linux
allows, the readable part only what is left. A plain name never contains
``_``, so a hashed name can never be claimed by typing it. The earlier rule kept
only 8 hex digits (32 bits): two names built to collide (found in about 100,000
tries) shared one account.

A hash of fixed length can still collide in principle, so an account also
records the hub name it was made for, in its GECOS comment (what ``getent
passwd`` shows on the host and on Slurm nodes alike)::

    gpulab sha256=<hex SHA-256 of the hub name> <the name, for people>

and an account whose record names another hub user is never used for this one.
When its hub user is deleted, the record becomes ``gpulab retired <date> <the
record>`` (:mod:`gpulab.enforcement.retired_accounts`): the account then belongs to
no one, and a new hub user who takes the name does not get it or its home.
Accounts made by the earlier rule carry ``gpulab user <hub name>``; that record
still counts when it names exactly this hub user, so a site upgrading keeps its
users' accounts and homes.
"""

from __future__ import annotations

import base64
import hashlib
import re

#: Linux (useradd) accepts names up to 32 characters.
MAX_NAME = 32
#: base32 characters of the hash in a hashed name at least (5 bits each): 120
#: bits, so a collision needs about 2**60 tries. A prefix over 7 characters
#: leaves fewer, and the record below still keeps such a collision apart.
HASH_CHARS = 24
PLAIN = re.compile(r"[a-z0-9-]+")
_UNSAFE = re.compile(r"[^a-z0-9-]")
RECORD_TAG = "gpulab sha256="
LEGACY_TAG = "gpulab user "
RETIRED_TAG = "gpulab retired "
_LEGACY_HASH_HEX = 8
#: GECOS holds no ':' or newline; ',' separates its fields.
_NOT_IN_GECOS = re.compile(r"[^\x20-\x7e]|[:,]")


def _digest(hub_name: str) -> bytes:
    return hashlib.sha256(hub_name.encode("utf-8", "surrogatepass")).digest()


def is_plain(hub_name: str, prefix: str = "gpulab-") -> bool:
    """Whether the hub name is its account name as it is (after the prefix)."""
    return bool(PLAIN.fullmatch(hub_name)) and len(prefix + hub_name) <= MAX_NAME


def unix_name(hub_name: str, prefix: str = "gpulab-") -> str:
    """The account name for a hub user (pure; the same on every host)."""
    if is_plain(hub_name, prefix):
        return prefix + hub_name
    room = MAX_NAME - len(prefix) - 1
    code = base64.b32encode(_digest(hub_name)).decode().rstrip("=").lower()
    # The readable part gets what HASH_CHARS leaves; the hash fills the rest.
    safe = _UNSAFE.sub("", hub_name.lower())[: max(room - HASH_CHARS, 0)]
    return f"{prefix}{safe}_{code[: room - len(safe)]}"


def legacy_unix_name(hub_name: str, prefix: str = "gpulab-") -> str:
    """The name the earlier rule gave (8 hex digits of hash): where an upgraded
    site's existing account of this hub user may be."""
    if is_plain(hub_name, prefix):
        return prefix + hub_name
    digest = _digest(hub_name).hex()[:_LEGACY_HASH_HEX]
    keep = MAX_NAME - len(prefix) - 1 - _LEGACY_HASH_HEX
    safe = _UNSAFE.sub("", hub_name.lower())[: max(keep, 0)]
    return f"{prefix}{safe}_{digest}"


def account_record(hub_name: str) -> str:
    """The GECOS comment of a new account: whose it is, by the full hash."""
    shown = _NOT_IN_GECOS.sub("?", hub_name)[:64]
    return f"{RECORD_TAG}{_digest(hub_name).hex()} {shown}"


def retired_record(comment: str, on: str) -> str:
    """The comment of an account whose hub user was deleted ``on`` (a date)."""
    return f"{RETIRED_TAG}{on} {comment}"


def retired_on(comment: str) -> str | None:
    """The date a retired account's hub user was deleted, or None (not retired)."""
    if not comment.startswith(RETIRED_TAG):
        return None
    return comment[len(RETIRED_TAG) :].split(" ", 1)[0]


def retired_for(comment: str, hub_name: str) -> bool:
    """Whether the comment is of an account retired when ``hub_name`` was deleted."""
    on = retired_on(comment)
    if on is None:
        return False
    return recorded_for(comment[len(RETIRED_TAG) + len(on) + 1 :], hub_name) is True


def recorded_for(comment: str, hub_name: str) -> bool | None:
    """True if the comment records this hub user, False if it records another
    (a retired account records an earlier user, even of the same name), None if
    it is no gpulab record (an account gpulab did not make)."""
    if comment.startswith(RETIRED_TAG):
        return False
    if comment.startswith(RECORD_TAG):
        recorded = comment[len(RECORD_TAG) :].split(" ", 1)[0]
        return recorded == _digest(hub_name).hex()
    if comment.startswith(LEGACY_TAG):
        # The earlier rule wrote the name itself; only an exact match counts (a
        # name it cut at 200 characters is not known for sure).
        return comment == LEGACY_TAG + hub_name
    return None
