-- KEYS: 1 counters, 2 run hash, 3 active (on a cluster the counters again: the caller updates
--       the set), 4 pending, 5 ledger; ARGV: 1 run, 2 now, 3 reason
-- Reply: {status before, children dropped from the waiting list, tasks still outstanding}
-- include: ../utils/wake.lua
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return {'', 0, 0} end
if status == 'done' or status == 'cancelled' then return {status, 0, 0} end
redis.call('HSET', KEYS[2], 'cancelled', ARGV[2], 'cancel_reason', ARGV[3])
local dropped, steps = 0, {}
for _, m in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  local ok, msg = pcall(cjson.decode, m)
  if ok and type(msg) == 'table' then
    if msg['id'] then redis.call('HDEL', KEYS[5], msg['id']) end
    local step = type(msg['meta']) == 'table' and msg['meta']['step'] or nil
    if type(step) == 'string' then steps[step] = (steps[step] or 0) + 1 end
  end
  dropped = dropped + 1
end
redis.call('DEL', KEYS[4])
for step, k in pairs(steps) do redis.call('HINCRBY', KEYS[1], step .. ':cancelled', k) end
local left = tonumber(redis.call('HGET', KEYS[1], 'outstanding') or '0')
if dropped > 0 then
  redis.call('HINCRBY', KEYS[1], 'cancelled', dropped)
  left = redis.call('HINCRBY', KEYS[1], 'outstanding', -dropped)
end
if left <= 0 then
  redis.call('HSET', KEYS[2], 'status', 'cancelled', 'finished', ARGV[2])
  if KEYS[3] ~= KEYS[1] then redis.call('SREM', KEYS[3], ARGV[1]) end  -- a cluster: the caller's
  redis.call('DEL', KEYS[5])
end
wake(KEYS[2], left <= 0 and 'e' or 'p')  -- ended, or cancelling while its tasks drain
return {status, dropped, left}
