-- KEYS: 1 counters, 2 run hash, 3 pending, 4 staging; moves waiting tasks up to the cap
-- (none while the run is paused)
if redis.call('HEXISTS', KEYS[2], 'paused') == 1 then return 0 end
local cap = tonumber(redis.call('HGET', KEYS[2], 'cap') or '0')
local inflight = tonumber(redis.call('HGET', KEYS[1], 'inflight') or '0')
-- include: release_loop.lua
return moved
