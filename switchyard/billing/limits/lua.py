"""The Lua scripts `ValkeyLimiter` runs: each check-and-reserve is one script, so it is atomic.

Every script takes the time as its first argument: a number (tests, replays) or "" for Valkey's own
clock (`TIME`), so replicas with drifting clocks still agree on refills and reservation expiry.
Money is integer nano-dollars (see `scopes.py`); bucket levels are floats written with 17 digits.

Keys, under the limiter's prefix:
    budget:<scope>:<period>:spent   string, nano-USD settled in the period (expires a day after it)
    budget:<scope>:<period>:held    hash, reservation id -> nano-USD held
    budget:<scope>:<period>:expiry  sorted set, reservation id -> when its hold lapses (unix seconds)
    rate:<scope>:<kind>             hash {level, ts}: a token bucket (expires once it would be full)
"""

from __future__ import annotations

_CLOCK = """
local function clock()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

_RESERVED = """
local function reserved(held, expiry, now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', expiry, '-inf', now)) do
    redis.call('ZREM', expiry, id)
    redis.call('HDEL', held, id)
  end
  local total = 0
  for _, amount in ipairs(redis.call('HVALS', held)) do total = total + tonumber(amount) end
  return total
end
"""

# KEYS: one bucket per limit. ARGV: now, then capacity and cost per key.
# Returns {1 if every bucket paid else 0, level of each bucket after (or before, when refused)}.
CHECK_RATE = (
    _CLOCK
    + """
local now = clock()
local levels = {}
local paid = 1
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', key, 'level', 'ts')
  local level = capacity
  if state[1] then
    local elapsed = math.max(0, now - tonumber(state[2]))
    level = math.min(capacity, tonumber(state[1]) + elapsed * capacity / 60)
  end
  levels[i] = level
  if tonumber(ARGV[2 * i + 1]) > level then paid = 0 end
end
local out = {paid}
for i, key in ipairs(KEYS) do
  local level = levels[i]
  if paid == 1 then
    level = level - tonumber(ARGV[2 * i + 1])
    local ts = redis.call('HGET', key, 'ts')
    if ts then ts = math.max(tonumber(ts), now) else ts = now end
    redis.call('HSET', key, 'level', string.format('%.17g', level), 'ts', string.format('%.17g', ts))
    redis.call('EXPIRE', key, 61)
  end
  out[i + 1] = string.format('%.17g', level)
end
return out
"""
)

# KEYS: spent, held, expiry per scope. ARGV: now, reservation id, amount, ttl_s, then limit and keep_s
# per scope. Returns 1 when held in every scope, 0 (nothing held) when any scope lacks the room.
RESERVE = (
    _CLOCK
    + _RESERVED
    + """
local now = clock()
local amount = tonumber(ARGV[3])
local scopes = #KEYS / 3
for i = 0, scopes - 1 do
  local spent = tonumber(redis.call('GET', KEYS[3 * i + 1]) or '0')
  local room = tonumber(ARGV[5 + 2 * i]) - spent - reserved(KEYS[3 * i + 2], KEYS[3 * i + 3], now)
  if room <= 0 or amount > room then return 0 end
end
for i = 0, scopes - 1 do
  local keep = ARGV[6 + 2 * i]
  redis.call('HINCRBY', KEYS[3 * i + 2], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[3 * i + 3], now + tonumber(ARGV[4]), ARGV[2])
  redis.call('EXPIRE', KEYS[3 * i + 2], keep)
  redis.call('EXPIRE', KEYS[3 * i + 3], keep)
end
return 1
"""
)

# KEYS: the spent key of each scope (period of `at`), then held and expiry pairs to release from.
# ARGV: reservation id, actual amount, number of spent keys, then keep_s per spent key.
SETTLE = """
local spent_keys = tonumber(ARGV[3])
for i = 1, spent_keys do
  if tonumber(ARGV[2]) ~= 0 then
    redis.call('INCRBY', KEYS[i], ARGV[2])
    redis.call('EXPIRE', KEYS[i], ARGV[3 + i])
  end
end
for i = spent_keys + 1, #KEYS, 2 do
  redis.call('HDEL', KEYS[i], ARGV[1])
  redis.call('ZREM', KEYS[i + 1], ARGV[1])
end
return 1
"""

# KEYS: spent, held, expiry per scope. ARGV: now. Returns {spent, reserved} per scope (lapsed holds dropped).
STANDING = (
    _CLOCK
    + _RESERVED
    + """
local now = clock()
local out = {}
for i = 0, #KEYS / 3 - 1 do
  out[2 * i + 1] = tonumber(redis.call('GET', KEYS[3 * i + 1]) or '0')
  out[2 * i + 2] = reserved(KEYS[3 * i + 2], KEYS[3 * i + 3], now)
end
return out
"""
)
