"""Basic auth for the HTTP endpoint: bcrypt hashes checked at start-up, checked per request with
a short cache of successes (as exporter-toolkit does), equal cost for unknown users, and a bound
on how many bcrypt checks run at once.
"""
from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from typing import Callable

AUTH_CACHE_SECONDS = 60.0  # bcrypt costs ~0.1-0.3 s a check; Prometheus scrapes every 15-60 s
AUTH_CACHE_SIZE = 100
# bcrypt checks at once: 16 password guessers used 174% CPU of a 2-CPU node without a bound.
# One core at most for whoever can reach the port; scrapers are spared by the sliding cache.
AUTH_CONCURRENCY = 1
AUTH_WAIT = 1.0  # seconds a check waits for a free slot before the request gets 429

_BCRYPT_HASH = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")


class AuthBusy(Exception):
    """Every bcrypt slot stayed taken for AUTH_WAIT seconds: answer 429, try again later."""


def hash_problem(hashed: str) -> str | None:
    """Why `hashed` is not a bcrypt hash this exporter can check, or None when it is.

    The cost must be 4..31 and the salt well-formed: bcrypt refuses anything else with a
    ValueError, which used to surface as a traceback on every request naming that user.
    """
    match = _BCRYPT_HASH.match(hashed)
    if not match:
        return ("must be a bcrypt hash ($2b$...), for example from: "
                "htpasswd -nBC 12 '' | tr -d ':\\n'")
    cost = int(match.group(1))
    if not 4 <= cost <= 31:
        return f"bcrypt cost {match.group(1)} is outside 4..31 (use 10-12, as htpasswd -nBC 12)"
    import bcrypt  # here and below: only a web config with users needs it
    try:  # the salt, checked at the cheapest cost: the real one may take seconds
        bcrypt.hashpw(b"", (hashed[:4] + "04" + hashed[6:29]).encode())
    except ValueError:
        return "malformed bcrypt salt (the 22 characters after the cost); make the hash again"
    return None


def _dummy_hash(users: dict[str, bytes]) -> bytes:
    """A hash nobody's password matches, of the highest cost among the users', so that checking
    an unknown name costs what checking a known one does. Built from a cost-4 hash (cheap to
    make) with the cost field raised: the check of it still runs the full cost."""
    if not users:
        return b""
    import bcrypt
    cost = max(int(h[4:6]) for h in users.values())
    cheap = bcrypt.hashpw(b"no password matches this", bcrypt.gensalt(rounds=4))
    return cheap[:4] + b"%02d" % cost + cheap[6:]


class BasicAuth:
    """bcrypt checks with a short cache of successes.

    The cache key is a SHA-256 over user, stored hash and password, so the cache holds no
    password and a changed hash misses; a hit slides the expiry. An unknown user costs one
    bcrypt check against a dummy hash of the same cost as the real ones. At most `concurrency`
    bcrypt checks run at once; a
    check that cannot get a slot within `wait` seconds raises AuthBusy. Cache hits need no slot,
    so a scraper whose password was checked in the last minute is answered during a flood of
    guesses.
    """

    def __init__(self, users: dict[str, bytes], ttl: float = AUTH_CACHE_SECONDS,
                 size: int = AUTH_CACHE_SIZE, clock: Callable[[], float] = time.monotonic,
                 concurrency: int = AUTH_CONCURRENCY, wait: float = AUTH_WAIT,
                 checkpw: Callable[[bytes, bytes], bool] | None = None) -> None:
        self.users = users
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self.wait = wait
        if checkpw is None and users:
            import bcrypt
            checkpw = bcrypt.checkpw
        self._checkpw = checkpw or (lambda password, hashed: False)  # no users: never asked
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrency)
        self.dummy = _dummy_hash(users)
        self.bcrypt_checks = 0  # counted so tests can see the cache work

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def _key(self, user: str, password: str) -> bytes:
        hashed = self.users.get(user) or b""
        return hashlib.sha256(b"\0".join([user.encode("utf-8", "surrogateescape"), hashed,
                                          password.encode("utf-8", "surrogateescape")])).digest()

    def cached(self, user: str, password: str) -> bool:
        """A success of the last `ttl` seconds (cheap: no bcrypt). A hit slides the expiry, so
        a scraper that keeps scraping never needs bcrypt again, and a flood of guesses holding
        every bcrypt slot cannot lock it out."""
        key, now = self._key(user, password), self.clock()
        with self._lock:
            expiry = self._cache.get(key)
            if expiry is None or expiry <= now:
                return False
            self._cache[key] = now + self.ttl
            self._cache.move_to_end(key)
            return True

    def check(self, user: str, password: str) -> bool:
        """The cache, else one bcrypt check (in a slot). AuthBusy when no slot came free."""
        if self.cached(user, password):
            return True
        secret = password.encode("utf-8", "surrogateescape")
        if len(secret) > 72:  # bcrypt's limit; the library refuses rather than truncates
            return False
        hashed = self.users.get(user)
        if not self._slots.acquire(timeout=self.wait):
            raise AuthBusy
        try:
            self.bcrypt_checks += 1
            ok = self._checkpw(secret, hashed or self.dummy) and hashed is not None
        finally:
            self._slots.release()
        if ok:
            key = self._key(user, password)
            with self._lock:
                self._cache[key] = self.clock() + self.ttl
                self._cache.move_to_end(key)
                while len(self._cache) > self.size:
                    self._cache.popitem(last=False)
        return ok
