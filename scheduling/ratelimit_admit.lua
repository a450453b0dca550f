-- KEYS: lease zsets (n_lease), then rate keys (n_rate)
-- ARGV: 1 task id, 2 n_lease, 3 n_rate, 4 max wait (us),
--       then per lease key: cap, ttl (us); then per rate key: interval (us), tolerance (us)
-- Returns {0, backlog_us} admitted | {1, 0} a cap is full | {2, backlog_us} rate backlog too long
local tid, nl, nr, max_wait = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, nl do
  local key, cap = KEYS[i], tonumber(ARGV[3 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  if not redis.call('ZSCORE', key, tid) and redis.call('ZCARD', key) >= cap then
    return {1, 0}
  end
end
local backlog = 0
local base = 4 + 2 * nl
for j = 1, nr do
  local tat = tonumber(redis.call('GET', KEYS[nl + j]) or '0')
  local w = tat - tonumber(ARGV[base + 2 * j]) - now
  if w > backlog then backlog = w end
end
if backlog > max_wait then return {2, backlog} end
for i = 1, nl do
  local ttl = tonumber(ARGV[4 + 2 * i])
  redis.call('ZADD', KEYS[i], fmt(now + ttl), tid)
  redis.call('PEXPIRE', KEYS[i], math.ceil(ttl / 1000) + 60000)
end
return {0, backlog}
