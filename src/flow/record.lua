-- Adds a flow mark to one or two sessions of one client (src/flow/redis.rs).
-- KEYS[1] the client's flow sessions (a sorted set of session keys scored by
-- last use), KEYS[2] every flow session of the deployment (the same), KEYS[3]
-- how many sessions each client holds (a sorted set of hex client names),
-- KEYS[4..] the sessions (lists of marks `label:server:tool`).
-- ARGV: now_ms (the session KEYS[3 + n] is used at now_ms + n - 1), ttl_ms,
-- max_sessions, max_per_client, max_per_label, mark, label, client, the
-- prefix of a client's sessions set (for another client's).
-- The bounds of the in-process store, in one atomic step for the fleet: a
-- known mark is not added twice, a label keeps at most max_per_label marks
-- (its first ones); a new session past the client's bound drops the client's
-- own least recently used one, a full deployment drops the least recently
-- used session of the client holding the most. Every key gets ttl_ms (the
-- session's idle lifetime) again. Returns how many sessions were dropped.
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local max_all = tonumber(ARGV[3])
local max_client = tonumber(ARGV[4])
local max_label = tonumber(ARGV[5])
local mark = ARGV[6]
local prefix = ARGV[7] .. ':'
local client = ARGV[8]
local of = ARGV[9]
local stale = now - ttl
local dropped = 0

-- A client's count, from its own set (nothing in it: not counted).
local function count(owner)
  local n = redis.call('ZCARD', of .. owner)
  if n > 0 then
    redis.call('ZADD', KEYS[3], n, owner)
  else
    redis.call('ZREM', KEYS[3], owner)
  end
  return n
end

local function drop(session, owner)
  redis.call('DEL', session)
  redis.call('ZREM', of .. owner, session)
  redis.call('ZREM', KEYS[2], session)
  count(owner)
  dropped = dropped + 1
end

-- Sessions idle past their lifetime are gone already (their keys expired).
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', stale)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', stale)
count(client)

for i = 4, #KEYS do
  local session = KEYS[i]
  local marks = redis.call('LRANGE', session, 0, -1)
  if #marks > 0 then
    local known, same = false, 0
    for _, m in ipairs(marks) do
      if m == mark then known = true end
      if string.sub(m, 1, #prefix) == prefix then same = same + 1 end
    end
    if not known and same < max_label then
      redis.call('RPUSH', session, mark)
    end
  else
    if redis.call('ZCARD', KEYS[1]) >= max_client then
      local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)
      if oldest[1] then drop(oldest[1], client) end
    elseif redis.call('ZCARD', KEYS[2]) >= max_all then
      -- The client holding the most, its count refreshed when it is met
      -- (other clients' expired sessions leave theirs high until then).
      local before = dropped
      for _ = 1, 16 do
        local top = redis.call('ZREVRANGE', KEYS[3], 0, 0)
        if not top[1] then break end
        redis.call('ZREMRANGEBYSCORE', of .. top[1], '-inf', stale)
        count(top[1])
        local still = redis.call('ZREVRANGE', KEYS[3], 0, 0)
        if still[1] == top[1] then
          local oldest = redis.call('ZRANGE', of .. top[1], 0, 0)
          if oldest[1] then drop(oldest[1], top[1]) end
          break
        end
      end
      if dropped == before then
        -- Counts still moving after 16 looks: the deployment's least
        -- recently used session (its client is in its key), so the bound holds.
        local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
        if oldest[1] then
          drop(oldest[1], string.match(oldest[1], ':flow:(%x*)%.') or '')
        end
      end
    end
    redis.call('RPUSH', session, mark)
  end
  redis.call('PEXPIRE', session, ttl)
  redis.call('ZADD', KEYS[1], now + i - 4, session)
  redis.call('ZADD', KEYS[2], now + i - 4, session)
end
count(client)
for i = 1, 3 do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return dropped
