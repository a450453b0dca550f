-- The adaptive delay of one site, shared by every worker (scheduling/throttle.py).
-- One call applies a worker's buffered feedback and, when asked, reserves the site's next
-- request slot: requests to a site start at least `delay` apart, whoever sends them.
--
-- KEYS: 1 the site's state hash, 2 the set of throttled sites (left out on a cluster, where
--       it is on another slot: the caller adds a new site itself)
-- ARGV: 1 site, 2 reserve (1: take the next slot), 3 responses with status 200,
--       4 their latency sum (us), 5 worst latency of other answers (us, 0: none),
--       6 backoff (1: a 429/503 was seen), 7 Retry-After (us, 0: none),
--       8 target concurrency, 9 start delay (us), 10 max delay (us), 11 max pause (us),
--       12 max wait (us), 13 idle expiry of the state (ms)
-- Returns {status, wait_us, delay_us, new}: status 0 = slot reserved, send after wait_us;
--         1 = the slot is further than max wait, nothing reserved; 2 = feedback only;
--         new 1 = the site had no state before this call
-- include: server_time.lua

local h = redis.call('HMGET', KEYS[1], 'delay', 'last', 'pause', 'latency', 'backoff_at',
                     'samples', 'backoffs', 'floor')
local start = tonumber(ARGV[9])
local delay = tonumber(h[1]) or start
local last = tonumber(h[2]) or 0
local pause = tonumber(h[3]) or 0
local latency = tonumber(h[4]) or 0
local backoff_at = tonumber(h[5]) or 0
local samples = tonumber(h[6]) or 0
local backoffs = tonumber(h[7]) or 0
local floor = tonumber(h[8]) or 0
local conc, max_delay = tonumber(ARGV[8]), tonumber(ARGV[10])
local learned = not h[1]  -- whether more than the reserved slot must be written back

-- AutoThrottle's rule, once per response: halfway to latency / target concurrency, and
-- straight up to it when that is higher; never below the floor a 429/503 left, which
-- halves every 32 answers (the site may have recovered: probe again, slowly)
local n = tonumber(ARGV[3])
if n > 0 then
  local mean = tonumber(ARGV[4]) / n
  local target = mean / conc
  for _ = 1, math.min(n, 64) do
    delay = math.max(target, (delay + target) / 2)
  end
  floor = floor * 0.5 ^ (n / 32)
  if floor < 1000 then floor = 0 end
  delay = math.max(delay, floor)
  if latency == 0 then latency = mean else latency = latency + (mean - latency) * (1 - 0.8 ^ n) end
  samples = samples + n
  learned = true
end

-- other answers (errors, redirects, no answer) may raise the delay, never lower it: error
-- pages are small and fast, and would otherwise speed up a struggling site
local other = tonumber(ARGV[5])
if other > 0 then
  local target = other / conc
  local nd = math.max(target, (delay + target) / 2)
  if nd > delay then delay = nd end
  learned = true
end

-- 429/503: double the delay, at most once per delay (the answers to requests already in
-- flight say nothing new), make it the floor, and pause the site until its Retry-After
if ARGV[6] == '1' then
  learned = true
  if now - backoff_at >= math.max(delay, latency) then
    delay = math.max(delay * 2, start, 100000)
    floor = delay
    backoff_at = now
    backoffs = backoffs + 1
  end
  local ra = tonumber(ARGV[7])
  if ra > 0 then pause = math.max(pause, now + math.min(ra, tonumber(ARGV[11]))) end
end
if delay > max_delay then delay = max_delay end

local status, wait = 2, 0
if ARGV[2] == '1' then
  local slot = math.max(now, last + delay, pause)
  wait = slot - now
  if wait > tonumber(ARGV[12]) then
    status = 1
  else
    status = 0
    last = slot
  end
end

if learned then
  redis.call('HSET', KEYS[1], 'delay', fmt(delay), 'last', fmt(last), 'pause', fmt(pause),
             'latency', fmt(latency), 'backoff_at', fmt(backoff_at), 'samples', fmt(samples),
             'backoffs', fmt(backoffs), 'floor', fmt(floor))
elseif status == 0 then
  redis.call('HSET', KEYS[1], 'last', fmt(last))
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[13]))
if not h[1] and KEYS[2] then redis.call('SADD', KEYS[2], ARGV[1]) end
return {status, math.floor(wait), math.floor(delay), h[1] and 0 or 1}
