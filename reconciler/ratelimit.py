"""A token-bucket rate limiter on a `Clock`, used to pace reconciliation rounds."""

from __future__ import annotations

from reconciler.clock import Clock


class RateLimiter:
    """Allows ``rate`` events per second with bursts of up to ``burst`` events."""

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"RateLimiter: need rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.now()

    def delay(self) -> float:
        """Take one token and return how long to wait for it (0 when one was available)."""
        now = self._clock.now()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.rate

    async def wait(self) -> None:
        """Take one token, sleeping on the clock until it is available."""
        d = self.delay()
        if d > 0:
            await self._clock.sleep(d)
