-- The admission gate's script (scheduling/gate.py and scheduling/throttle.py): one script
-- of four operations, named by ARGV[1].
--
--   admit     take a task's concurrency leases (or say how long to wait)
--     KEYS: lease zsets (n_lease), then rate keys (n_rate)
--     ARGV: 1 'admit', 2 task id, 3 n_lease, 4 n_rate, 5 max wait (us),
--           then per lease key: cap, ttl (us); then per rate key: interval (us), tolerance (us)
--     -> {0, backlog_us} admitted | {1, 0} a cap is full | {2, backlog_us} rate backlog too long
--   token     reserve a request's slot on every rate scope, renew the running task's leases
--     KEYS: rate keys (n_rate), then lease zsets (n_lease) of the running task
--     ARGV: 1 'token', 2 task id, 3 n_rate, 4 n_lease, 5 max wait (us),
--           then per rate key: interval (us), tolerance (us); then per lease key: ttl (us)
--     -> {0, wait_us} reserved: send after wait_us | {1, wait_us} too long, nothing reserved
--   throttle  the adaptive delay of one site, shared by every worker: apply a worker's
--             buffered feedback and, when asked, reserve the site's next request slot
--             (requests to a site start at least `delay` apart, whoever sends them)
--     KEYS: 1 the site's state hash, 2 the set of throttled sites (left out on a cluster,
--           where it is on another slot: the caller adds a new site itself)
--     ARGV: 1 'throttle', 2 site, 3 reserve (1: take the next slot), 4 responses with status
--           200, 5 their latency sum (us), 6 worst latency of other answers (us, 0: none),
--           7 backoff (1: a 429/503 was seen), 8 Retry-After (us, 0: none), 9 target
--           concurrency, 10 start delay (us), 11 max delay (us), 12 max pause (us),
--           13 max wait (us), 14 idle expiry of the state (ms)
--     -> {status, wait_us, delay_us, new}: status 0 = slot reserved, send after wait_us;
--        1 = the slot is further than max wait, nothing reserved; 2 = feedback only;
--        new 1 = the site had no state before this call
--   request   token, then throttle: a request's one call
--     KEYS: token's, then throttle's; ARGV: 1 'request', token's from 2 on, then throttle's
--           from 2 on -> {token's result, throttle's result} (a slot one side reserved when
--           the other refuses is left unused: the request goes later, never sooner)
-- include: server_time.lua
local op, tid, max_wait = ARGV[1], ARGV[2], tonumber(ARGV[5])

local function admit(nl, nr)
  for i = 1, nl do
    local key, cap = KEYS[i], tonumber(ARGV[4 + 2 * i])
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    if not redis.call('ZSCORE', key, tid) and redis.call('ZCARD', key) >= cap then
      return {1, 0}
    end
  end
  local backlog = 0
  local base = 5 + 2 * nl
  for j = 1, nr do
    local tat = tonumber(redis.call('GET', KEYS[nl + j]) or '0')
    local w = tat - tonumber(ARGV[base + 2 * j]) - now
    if w > backlog then backlog = w end
  end
  if backlog > max_wait then return {2, backlog} end
  for i = 1, nl do
    local ttl = tonumber(ARGV[5 + 2 * i])
    redis.call('ZADD', KEYS[i], fmt(now + ttl), tid)
    redis.call('PEXPIRE', KEYS[i], math.ceil(ttl / 1000) + 60000)
  end
  return {0, backlog}
end

local function token(nr, nl)
  local tats = {}
  local wait = 0
  for j = 1, nr do
    local tat = tonumber(redis.call('GET', KEYS[j]) or '0')
    if tat < now then tat = now end
    tats[j] = tat
    local w = tat - tonumber(ARGV[5 + 2 * j]) - now
    if w > wait then wait = w end
  end
  if wait > max_wait then return {1, wait} end
  local go = now + wait
  for j = 1, nr do
    local tat = math.max(tats[j], go) + tonumber(ARGV[4 + 2 * j])
    redis.call('SET', KEYS[j], fmt(tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  end
  local base = 5 + 2 * nr
  for i = 1, nl do
    if tid ~= '' then
      local ttl = tonumber(ARGV[base + i])
      if redis.call('ZADD', KEYS[nr + i], 'XX', 'CH', fmt(now + ttl), tid) == 1 then
        redis.call('PEXPIRE', KEYS[nr + i], math.ceil(ttl / 1000) + 60000)
      end
    end
  end
  return {0, wait}
end

-- the throttle's arguments and keys start after `a` and `k` (0 and 1 for its own call)
local function throttle(k, a)
  local h = redis.call('HMGET', KEYS[k + 1], 'delay', 'last', 'pause', 'latency', 'backoff_at',
                       'samples', 'backoffs', 'floor')
  local start = tonumber(ARGV[a + 9])
  local delay = tonumber(h[1]) or start
  local last = tonumber(h[2]) or 0
  local pause = tonumber(h[3]) or 0
  local latency = tonumber(h[4]) or 0
  local backoff_at = tonumber(h[5]) or 0
  local samples = tonumber(h[6]) or 0
  local backoffs = tonumber(h[7]) or 0
  local floor = tonumber(h[8]) or 0
  local conc, max_delay = tonumber(ARGV[a + 8]), tonumber(ARGV[a + 10])
  local learned = not h[1]  -- whether more than the reserved slot must be written back

  -- AutoThrottle's rule, once per response: halfway to latency / target concurrency, and
  -- straight up to it when that is higher; never below the floor a 429/503 left, which
  -- halves every 32 answers (the site may have recovered: probe again, slowly)
  local n = tonumber(ARGV[a + 3])
  if n > 0 then
    local mean = tonumber(ARGV[a + 4]) / n
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
  local other = tonumber(ARGV[a + 5])
  if other > 0 then
    local target = other / conc
    local nd = math.max(target, (delay + target) / 2)
    if nd > delay then delay = nd end
    learned = true
  end

  -- 429/503: double the delay, at most once per delay (the answers to requests already in
  -- flight say nothing new), make it the floor, and pause the site until its Retry-After
  if ARGV[a + 6] == '1' then
    learned = true
    if now - backoff_at >= math.max(delay, latency) then
      delay = math.max(delay * 2, start, 100000)
      floor = delay
      backoff_at = now
      backoffs = backoffs + 1
    end
    local ra = tonumber(ARGV[a + 7])
    if ra > 0 then pause = math.max(pause, now + math.min(ra, tonumber(ARGV[a + 11]))) end
  end
  if delay > max_delay then delay = max_delay end

  local status, wait = 2, 0
  if ARGV[a + 2] == '1' then
    local slot = math.max(now, last + delay, pause)
    wait = slot - now
    if wait > tonumber(ARGV[a + 12]) then
      status = 1
    else
      status = 0
      last = slot
    end
  end

  if learned then
    redis.call('HSET', KEYS[k + 1], 'delay', fmt(delay), 'last', fmt(last), 'pause', fmt(pause),
               'latency', fmt(latency), 'backoff_at', fmt(backoff_at), 'samples', fmt(samples),
               'backoffs', fmt(backoffs), 'floor', fmt(floor))
  elseif status == 0 then
    redis.call('HSET', KEYS[k + 1], 'last', fmt(last))
  end
  redis.call('PEXPIRE', KEYS[k + 1], tonumber(ARGV[a + 13]))
  if not h[1] and KEYS[k + 2] then redis.call('SADD', KEYS[k + 2], ARGV[a + 1]) end
  return {status, math.floor(wait), math.floor(delay), h[1] and 0 or 1}
end

if op == 'admit' then return admit(tonumber(ARGV[3]), tonumber(ARGV[4])) end
if op == 'throttle' then return throttle(0, 1) end
local nr, nl = tonumber(ARGV[3]), tonumber(ARGV[4])
local slot = token(nr, nl)
if op == 'token' then return slot end
return {slot, throttle(nr + nl, 5 + 2 * nr + nl)}
