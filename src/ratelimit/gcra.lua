-- Portcullis rate limiting: GCRA over every bucket of one call, all or nothing.
-- The same arithmetic as src/ratelimit/gcra.rs, on the same integers:
--   tat'  = max(tat, now) + interval
--   admit <=> tat' - now <= capacity                (capacity = burst * interval)
--   retry = tat' - capacity - now
-- Times are nanoseconds, held as (seconds, nanoseconds) pairs so that every
-- value stays exact in Lua's doubles. A key holds its TAT as decimal
-- nanoseconds and expires one second after its bucket is full again (an
-- absent key is a full bucket, so expiry never changes a decision).
--
-- KEYS: one per bucket (distinct).
-- ARGV[1], ARGV[2]: now as seconds and nanoseconds, or "" and "" for the
--   server's own clock (TIME), which every replica shares.
-- ARGV[3 + 4(i-1) ...]: for KEYS[i]: interval seconds, interval nanoseconds,
--   capacity seconds, capacity nanoseconds.
-- ARGV[3 + 4 * #KEYS]: "take" to take the tokens when admitted, "peek" to
--   decide the same way and write nothing (a call not run yet).
-- Returns {1} when admitted (every TAT advanced), or {0, i, s, n}: KEYS[i] is
-- the bucket that admits last, and the call passes after s seconds n nanoseconds.

local G = 1000000000

-- Redis before 5 replicates scripts verbatim and refuses writes after TIME
-- unless told to replicate the writes instead (a no-op from Redis 7 on).
if redis.replicate_commands then redis.replicate_commands() end

local function norm(s, n)
  if n >= G then return s + 1, n - G end
  if n < 0 then return s - 1, n + G end
  return s, n
end

local function add(as, an, bs, bn) return norm(as + bs, an + bn) end
local function sub(as, an, bs, bn) return norm(as - bs, an - bn) end
local function le(as, an, bs, bn) return as < bs or (as == bs and an <= bn) end

local now_s, now_n
if ARGV[1] == "" then
  local t = redis.call("TIME")
  now_s, now_n = tonumber(t[1]), tonumber(t[2]) * 1000
else
  now_s, now_n = tonumber(ARGV[1]), tonumber(ARGV[2])
end

local next_s, next_n = {}, {}
local worst, worst_s, worst_n = 0, 0, 0
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  local int_s, int_n = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cap_s, cap_n = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local tat_s, tat_n = 0, 0
  local stored = redis.call("GET", KEYS[i])
  if stored then
    local len = string.len(stored)
    if len > 9 then
      tat_s = tonumber(string.sub(stored, 1, len - 9))
      tat_n = tonumber(string.sub(stored, len - 8))
    else
      tat_n = tonumber(stored)
    end
  end
  local base_s, base_n = tat_s, tat_n
  if le(tat_s, tat_n, now_s, now_n) then base_s, base_n = now_s, now_n end
  local ts, tn = add(base_s, base_n, int_s, int_n)
  local limit_s, limit_n = add(now_s, now_n, cap_s, cap_n)
  if le(ts, tn, limit_s, limit_n) then
    next_s[i], next_n[i] = ts, tn
  else
    local rs, rn = sub(ts, tn, cap_s, cap_n)
    rs, rn = sub(rs, rn, now_s, now_n)
    if worst == 0 or not le(rs, rn, worst_s, worst_n) then
      worst, worst_s, worst_n = i, rs, rn
    end
  end
end

if worst > 0 then
  return {0, worst, worst_s, worst_n}
end
if ARGV[3 + 4 * #KEYS] == "peek" then
  return {1}
end

for i = 1, #KEYS do
  local ds, dn = sub(next_s[i], next_n[i], now_s, now_n)
  local ttl_ms = ds * 1000 + math.ceil(dn / 1000000) + 1000
  redis.call("SET", KEYS[i], string.format("%d%09d", next_s[i], next_n[i]), "PX", ttl_ms)
end
return {1}
