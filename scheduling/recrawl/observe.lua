-- Apply one batch of observations of a watched set, all or nothing.
-- KEYS: 1 records (hash key -> "n x active last rate"), 2 due (zset key -> next visit),
--       3 inflight (zset key -> dispatched at), 4 totals (hash), 5 hours (hash), 6 misses (hash)
-- ARGV: 1 hour index (since 1970) of the observations, 2 number of keys,
--       3..26 exposure seconds per hour of day, 27..50 changes attributed per hour of day,
--       51 n, 52 x, 53 active, 54 rate power sum, 55 rate sum (deltas), 56 new keys,
--       then per key: key, the record read before (empty: none), the new record, due, changed
-- Returns {} when applied, else the 1-based positions of the keys whose record moved meanwhile
-- (nothing is written then: the caller reads them again and retries the whole batch).
local hour, nk = ARGV[1], tonumber(ARGV[2])
local base = 56
local moved = {}
for i = 1, nk do
  local j = base + (i - 1) * 5
  local cur = redis.call('HGET', KEYS[1], ARGV[j + 1]) or ''
  if cur ~= ARGV[j + 2] then moved[#moved + 1] = i end
end
if #moved > 0 then return moved end
local visits, changes, bought, found = 0, 0, 0, 0
for i = 1, nk do
  local j = base + (i - 1) * 5
  local key, rec, due, changed = ARGV[j + 1], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5] == '1'
  redis.call('HSET', KEYS[1], key, rec)
  redis.call('ZADD', KEYS[2], due, key)
  redis.call('HDEL', KEYS[6], key)
  local was_sent = redis.call('ZREM', KEYS[3], key) == 1
  if ARGV[j + 2] ~= '' then
    visits = visits + 1
    if changed then changes = changes + 1 end
    if was_sent then
      bought = bought + 1
      if changed then found = found + 1 end
    end
  end
end
for h = 0, 23 do
  local e, c = tonumber(ARGV[3 + h]), tonumber(ARGV[27 + h])
  if e ~= 0 then redis.call('HINCRBYFLOAT', KEYS[4], 'e' .. h, e) end
  if c ~= 0 then redis.call('HINCRBYFLOAT', KEYS[4], 'c' .. h, c) end
end
for k, name in ipairs({'n', 'x', 'active', 'sum', 'rsum'}) do
  local v = tonumber(ARGV[50 + k])
  if v ~= 0 then redis.call('HINCRBYFLOAT', KEYS[4], name, v) end
end
local counts = {keys = tonumber(ARGV[56]), visits = visits, changes = changes, bought = bought,
                found = found}
for name, v in pairs(counts) do
  if v ~= 0 then redis.call('HINCRBY', KEYS[4], name, v) end
end
for name, v in pairs({v = visits, c = changes, b = bought, f = found}) do
  if v ~= 0 then redis.call('HINCRBY', KEYS[5], hour .. ':' .. name, v) end
end
return {}
