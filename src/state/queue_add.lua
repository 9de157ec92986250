-- Queues a call for an operator's decision, fleet-wide (src/state/queue.rs).
-- KEYS[1] the call's key (its id, so an identical call finds it), KEYS[2] the
-- fleet's queued ids (a sorted set scored by expiry), KEYS[3] the client's,
-- KEYS[4] the new entry's key.
-- ARGV: now_ms, expires_ms, max, max_per_client, id, entry, ttl_ms,
-- entry key prefix, decision key prefix.
-- Returns {'found', id, entry, decision or ''} when the same call is queued
-- already, {'full'} or {'client_full'} past a bound, else {'added', id}.
-- Atomic in Redis: two replicas queueing one call at once queue it once.
local now = tonumber(ARGV[1])
local found = redis.call('GET', KEYS[1])
if found then
  local entry = redis.call('GET', ARGV[8] .. found)
  if entry then
    return {'found', found, entry, redis.call('GET', ARGV[9] .. found) or ''}
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then
  return {'full'}
end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[4]) then
  return {'client_full'}
end
local ttl = tonumber(ARGV[7])
redis.call('SET', KEYS[4], ARGV[6], 'PX', ttl)
redis.call('SET', KEYS[1], ARGV[5], 'PX', ttl)
redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), ARGV[5])
redis.call('ZADD', KEYS[3], tonumber(ARGV[2]), ARGV[5])
-- Each set lives as long as the entry expiring last in it.
for i = 2, 3 do
  local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
  local left = tonumber(last[2]) - now
  if left < ttl then left = ttl end
  redis.call('PEXPIRE', KEYS[i], left)
end
return {'added', ARGV[5]}
