-- An operator's decision on a queued call, fleet-wide (src/state/queue.rs).
-- KEYS[1] the entry's key, KEYS[2] its decision's key. ARGV[1] the decision.
-- Returns {'unknown'} (never queued, expired or used), {'decided', entry}
-- (this decision is the one), or {'already', entry, decision}. The
-- set-if-absent is atomic: of decisions posted to any replicas at once,
-- exactly one is taken. The decision lives as long as its entry.
local entry = redis.call('GET', KEYS[1])
if not entry then
  return {'unknown'}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  ttl = 1
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ttl) then
  return {'decided', entry}
end
return {'already', entry, redis.call('GET', KEYS[2]) or ''}
