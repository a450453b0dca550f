--[[ The global proxy pool's atomic steps (key layout: external_interface/resources/proxy/pool.py).

ARGV[1] is the operation:

record    KEYS score checked speed url stats ; ARGV id event elapsed|'' now smooth_above [times]
          haipproxy's score rule (models.next_score is its specification) on the current score,
          `times` times for successes (a held proxy's sum: holding.py; default 1).
          -> {state, score}: state 0 = not in the pool, 1 = updated, 2 = removed
take_raw  KEYS raw url ; ARGV n
          -> flat list id, url, id, url ... (each popped for one validator only)
add_raw   KEYS score raw url ; ARGV id url now
          -> 1 if queued (unknown to the pool and not queued yet)
]]
local op = ARGV[1]

if op == 'record' then
  local id, ev = ARGV[2], ARGV[3]
  local s = redis.call('ZSCORE', KEYS[1], id)
  if not s then return {0, ''} end
  s = tonumber(s)
  local new
  if ev == 'success' then
    new = s
    for _ = 1, tonumber(ARGV[7] or 1) do
      if new < tonumber(ARGV[6]) then new = new + 1
      else new = new + tonumber(string.format('%.2f', 10 / new)) end
    end
  elseif ev == 'timeout' then
    new = s - 1
    if new <= 0 then new = nil end
  elseif ev == 'dead' then
    new = nil
  else
    return {1, string.format('%.17g', s)}
  end
  if new == nil then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HINCRBY', KEYS[5], 'removed_' .. ev, 1)
    return {2, ''}
  end
  local v = string.format('%.17g', new)
  redis.call('ZADD', KEYS[1], v, id)
  if ARGV[4] ~= '' then redis.call('ZADD', KEYS[3], ARGV[4], id) end
  if ev == 'success' then redis.call('ZADD', KEYS[2], ARGV[5], id) end
  return {1, v}

elseif op == 'take_raw' then
  local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
  local out = {}
  for _, id in ipairs(ids) do
    redis.call('ZREM', KEYS[1], id)
    local url = redis.call('HGET', KEYS[2], id)
    if url then out[#out + 1] = id; out[#out + 1] = url end
  end
  return out

elseif op == 'add_raw' then
  if redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
  if redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[2]) == 0 then return 0 end
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
  return 1
end
return redis.error_reply('pool.lua: unknown op ' .. tostring(op))
