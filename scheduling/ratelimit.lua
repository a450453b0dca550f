-- The shared limits (scheduling/ratelimit.py), one script of two operations, ARGV[1]:
--   admit  take a task's concurrency leases (or say how long to wait)
--     KEYS: lease zsets (n_lease), then rate keys (n_rate)
--     ARGV: 1 'admit', 2 task id, 3 n_lease, 4 n_rate, 5 max wait (us),
--           then per lease key: cap, ttl (us); then per rate key: interval (us), tolerance (us)
--     -> {0, backlog_us} admitted | {1, 0} a cap is full | {2, backlog_us} rate backlog too long
--   token  reserve a request's slot on every rate scope, renew the running task's leases
--     KEYS: rate keys (n_rate), then lease zsets (n_lease) of the running task
--     ARGV: 1 'token', 2 task id, 3 n_rate, 4 n_lease, 5 max wait (us),
--           then per rate key: interval (us), tolerance (us); then per lease key: ttl (us)
--     -> {0, wait_us} reserved: send after wait_us | {1, wait_us} too long, nothing reserved
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

if op == 'admit' then return admit(tonumber(ARGV[3]), tonumber(ARGV[4])) end
return token(tonumber(ARGV[3]), tonumber(ARGV[4]))
