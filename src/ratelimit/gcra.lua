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
--   decide the same way and write nothing (a call not run yet), "refund" to
--   give back the tokens of an earlier take.
-- Returns {1} when a peek admits, {1, s1, n1, s2, n2, ...} when a take admits
-- (the TAT it stored in each KEYS[i]: what a refund of it names), or
-- {0, i, s, n}: KEYS[i] is the bucket that admits last, and the call passes
-- after s seconds n nanoseconds.
--
-- A refund: ARGV[4 + 4 * #KEYS + 2(i-1) ...] is the TAT (seconds,
-- nanoseconds) the take stored in KEYS[i]. A bucket still holding exactly that
-- TAT (no other take since) gets it back less one interval; a full one has
-- nothing to give back; one another take moved on keeps the token (which part
-- of it is still owed cannot be told from the TAT alone). Returns {2, spent}:
-- how many buckets kept their token.

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

local mode = ARGV[3 + 4 * #KEYS]

local function read_tat(key)
  local stored = redis.call("GET", key)
  if not stored then return 0, 0, false end
  local len = string.len(stored)
  if len > 9 then
    return tonumber(string.sub(stored, 1, len - 9)), tonumber(string.sub(stored, len - 8)), stored
  end
  return 0, tonumber(stored), stored
end

local function store(key, ts, tn)
  local ds, dn = sub(ts, tn, now_s, now_n)
  local ttl_ms = ds * 1000 + math.ceil(dn / 1000000) + 1000
  redis.call("SET", key, string.format("%d%09d", ts, tn), "PX", ttl_ms)
end

if mode == "refund" then
  local spent = 0
  for i = 1, #KEYS do
    local a = 2 + (i - 1) * 4
    local int_s, int_n = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local b = 3 + 4 * #KEYS + (i - 1) * 2
    local took_s, took_n = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    local tat_s, tat_n, stored = read_tat(KEYS[i])
    if stored and tat_s == took_s and tat_n == took_n then
      local bs, bn = sub(took_s, took_n, int_s, int_n)
      if le(bs, bn, now_s, now_n) then
        redis.call("DEL", KEYS[i])
      else
        store(KEYS[i], bs, bn)
      end
    elseif stored and not le(tat_s, tat_n, now_s, now_n) then
      spent = spent + 1
    end
  end
  return {2, spent}
end

local next_s, next_n = {}, {}
local worst, worst_s, worst_n = 0, 0, 0
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  local int_s, int_n = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cap_s, cap_n = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local tat_s, tat_n = read_tat(KEYS[i])
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
if mode == "peek" then
  return {1}
end

local reply = {1}
for i = 1, #KEYS do
  store(KEYS[i], next_s[i], next_n[i])
  reply[2 * i] = next_s[i]
  reply[2 * i + 1] = next_n[i]
end
return reply
