-- Uses a requestState nonce once across the fleet (src/state/redis.rs).
-- KEYS[1] the nonce's key, KEYS[2] the fleet's used nonces (a sorted set
-- scored by expiry), KEYS[3] the client's.
-- ARGV: now_ms, expires_ms, max, max_per_client, nonce, ttl_ms.
-- Returns 1 used now, 0 used already, 2 the fleet is full, 3 the client is.
-- Redis runs a script atomically: the check and the set-if-absent are one
-- step for every replica.
local now = tonumber(ARGV[1])
local expires = tonumber(ARGV[2])
local ttl = tonumber(ARGV[6])
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then
  return 2
end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[4]) then
  return 3
end
redis.call('SET', KEYS[1], '1', 'NX', 'PX', ttl)
redis.call('ZADD', KEYS[2], expires, ARGV[5])
redis.call('ZADD', KEYS[3], expires, ARGV[5])
-- Each set lives as long as the nonce remembered longest in it.
for i = 2, 3 do
  local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
  local left = tonumber(last[2]) - now
  if left < ttl then left = ttl end
  redis.call('PEXPIRE', KEYS[i], left)
end
return 1
