-- KEYS: 1 counters, 2 run hash, 3 pending, 4 staging, 5 parked set; ARGV: 1 now
-- Reply: {status before ('' = no such run), was paused (0|1), cancelled (0|1), tasks released
-- into staging}; a cancelled run is left as it is (its waiting list was dropped)
-- include: ../utils/wake.lua
local rh = redis.call('HMGET', KEYS[2], 'status', 'paused', 'cap', 'cancelled')
if not rh[1] then return {'', 0, 0, 0} end
if not rh[2] or rh[4] then return {rh[1], rh[2] and 1 or 0, rh[4] and 1 or 0, 0} end
redis.call('HDEL', KEYS[2], 'paused', 'pause_reason')
wake(KEYS[2], 'p')
redis.call('DEL', KEYS[5])
redis.call('HSET', KEYS[2], 'last', ARGV[1])  -- the sweeper's stall clock starts again
local cap = tonumber(rh[3] or '0')
local inflight = tonumber(redis.call('HGET', KEYS[1], 'inflight') or '0')
-- include: release_loop.lua
return {rh[1], 1, 0, moved}
