-- Take the keys due now, as many as the budget allows, and mark them sent.
-- KEYS: 1 due (zset), 2 inflight (zset), 3 totals (hash), 4 misses (hash), 5 records (hash)
-- ARGV: 1 now (s), 2 budget (pages per day), 3 allowance cap (pages), 4 next look at a sent
--       key that never comes back (s), 5 most keys per call, 6 sends without an answer before a
--       key is dropped, 7 alpha (a dropped key's rate ** alpha leaves the rate power sum)
-- Returns {keys sent..., '', keys dropped...}
local now, budget, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local retry_at, most, max_miss = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local tokens = tonumber(redis.call('HGET', KEYS[3], 'tokens') or '0')
local since = tonumber(redis.call('HGET', KEYS[3], 'tokens_at') or ARGV[1])
if now > since then tokens = math.min(cap, tokens + budget * (now - since) / 86400) end
local n = math.min(math.floor(tokens), most)
local sent, dropped = {}, {}
if n > 0 then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, n)
  for _, key in ipairs(due) do
    local miss = 0
    if redis.call('ZSCORE', KEYS[2], key) then miss = redis.call('HINCRBY', KEYS[4], key, 1) end
    if miss >= max_miss then  -- sent again and again, never stored: gone from the site
      redis.call('ZREM', KEYS[1], key)
      redis.call('ZREM', KEYS[2], key)
      redis.call('HDEL', KEYS[4], key)
      local rec = redis.call('HGET', KEYS[5], key)
      if rec then
        local rate = tonumber(string.match(rec, '(%S+)$')) or 0
        redis.call('HINCRBYFLOAT', KEYS[3], 'sum', -(rate ^ tonumber(ARGV[7])))
        redis.call('HINCRBYFLOAT', KEYS[3], 'rsum', -rate)
        redis.call('HINCRBY', KEYS[3], 'keys', -1)
        redis.call('HDEL', KEYS[5], key)
      end
      dropped[#dropped + 1] = key
    else
      redis.call('ZADD', KEYS[1], retry_at, key)
      redis.call('ZADD', KEYS[2], now, key)
      sent[#sent + 1] = key
    end
  end
end
tokens = tokens - #sent
redis.call('HSET', KEYS[3], 'tokens', tostring(tokens), 'tokens_at', ARGV[1])
if #sent > 0 then redis.call('HINCRBY', KEYS[3], 'dispatched', #sent) end
if #dropped > 0 then redis.call('HINCRBY', KEYS[3], 'dropped', #dropped) end
local out = sent
out[#out + 1] = ''
for _, key in ipairs(dropped) do out[#out + 1] = key end
return out
