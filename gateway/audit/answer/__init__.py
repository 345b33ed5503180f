"""The answer's steps (`gateway.audit.exchange.ANSWER`): each sees a stream's events one at a
time, in order, and says pass, hold or drop; none imports another, or aiohttp."""
