-- What one session holds, and its last use now (src/flow/redis.rs).
-- KEYS[1] the session (a list of marks), KEYS[2] its client's flow sessions,
-- KEYS[3] every flow session of the deployment (sorted sets by last use).
-- ARGV: now_ms, ttl_ms. A session read is used: its lifetime starts again.
local marks = redis.call('LRANGE', KEYS[1], 0, -1)
if #marks > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZADD', KEYS[2], 'XX', ARGV[1], KEYS[1])
  redis.call('ZADD', KEYS[3], 'XX', ARGV[1], KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return marks
