-- The fleet's queued calls, oldest expiry first (src/state/queue.rs).
-- KEYS[1] the fleet's queued ids. ARGV: now_ms, entry key prefix, decision
-- key prefix, max. Returns entry, decision-or-'' pairs, at most max of them.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]))
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)
local out = {}
for _, id in ipairs(ids) do
  local entry = redis.call('GET', ARGV[2] .. id)
  if entry then
    table.insert(out, entry)
    table.insert(out, redis.call('GET', ARGV[3] .. id) or '')
  end
end
return out
