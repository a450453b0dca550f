-- KEYS: rate keys (n_rate), then lease zsets (n_lease) of the running task
-- ARGV: 1 task id, 2 n_rate, 3 n_lease, 4 max wait (us),
--       then per rate key: interval (us), tolerance (us); then per lease key: ttl (us)
-- Returns {0, wait_us} reserved: send after wait_us | {1, wait_us} too long, nothing reserved
local tid, nr, nl, max_wait = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tats = {}
local wait = 0
for j = 1, nr do
  local tat = tonumber(redis.call('GET', KEYS[j]) or '0')
  if tat < now then tat = now end
  tats[j] = tat
  local w = tat - tonumber(ARGV[4 + 2 * j]) - now
  if w > wait then wait = w end
end
if wait > max_wait then return {1, wait} end
local go = now + wait
for j = 1, nr do
  local tat = math.max(tats[j], go) + tonumber(ARGV[3 + 2 * j])
  redis.call('SET', KEYS[j], fmt(tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
end
local base = 4 + 2 * nr
for i = 1, nl do
  if tid ~= '' then
    local ttl = tonumber(ARGV[base + i])
    if redis.call('ZADD', KEYS[nr + i], 'XX', 'CH', fmt(now + ttl), tid) == 1 then
      redis.call('PEXPIRE', KEYS[nr + i], math.ceil(ttl / 1000) + 60000)
    end
  end
end
return {0, wait}
