-- Binds a task or a 2025-era session to its client for the fleet (src/state/redis.rs).
-- KEYS[1] the binding's key, KEYS[2] the client's bindings of that kind (a sorted set of
-- keys scored by creation time).
-- ARGV: value, ttl_ms, now_ms, max_per_client, max_ttl_ms.
-- Past max_per_client, the client's own oldest bindings are forgotten (their
-- keys deleted), never another client's. Returns how many were forgotten.
local ttl = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local max = tonumber(ARGV[4])
local max_ttl = tonumber(ARGV[5])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - max_ttl)
-- The new binding is never the one forgotten, whatever the clock of the replica
-- that writes it: it is taken out of the count, the client's oldest others are
-- forgotten until there is room, and then it is added. (Trimming by score alone
-- would pick it when its replica's clock lags, and it would outlive the bound.)
redis.call('ZREM', KEYS[2], KEYS[1])
local forgotten = 0
local over = redis.call('ZCARD', KEYS[2]) - (max - 1)
if over > 0 then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  for _, key in ipairs(oldest) do
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[2], key)
    forgotten = forgotten + 1
  end
end
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('PEXPIRE', KEYS[2], max_ttl + 1000)
return forgotten
