-- Records an operator's approval of a pin for the fleet (src/state/queue.rs).
-- KEYS[1] the deployment's pin approvals (a hash: pin -> approved hash).
-- ARGV: field, value, max fields, ttl_ms. Returns 0 when the hash holds its
-- bound of other pins (nothing written), else 1. Each write renews the TTL.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
  and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return 1
