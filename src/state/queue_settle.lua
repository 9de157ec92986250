-- Takes a queued call's decision, once, fleet-wide (src/state/queue.rs).
-- KEYS[1] the entry, KEYS[2] its decision, KEYS[3] the call's key, KEYS[4]
-- the fleet's queued ids, KEYS[5] the client's. ARGV: id, close ('1': the
-- holder gives up, so an undecided entry is taken out as expired).
-- Returns {'decided', decision} to exactly one caller (the entry leaves the
-- queue with it), {'pending'}, {'expired'} (closed undecided) or {'gone'}.
local decision = redis.call('GET', KEYS[2])
local exists = redis.call('EXISTS', KEYS[1])
if not decision and ARGV[2] ~= '1' then
  if exists == 1 then
    return {'pending'}
  end
  return {'gone'}
end
redis.call('DEL', KEYS[1], KEYS[2])
if redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
end
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
if decision then
  return {'decided', decision}
end
if exists == 1 then
  return {'expired'}
end
return {'gone'}
