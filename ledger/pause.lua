-- KEYS: 1 run hash; ARGV: 1 now, 2 reason
-- Reply: {status before ('' = no such run), paused already (0|1), cancelled (0|1)}
-- include: ../utils/wake.lua
local rh = redis.call('HMGET', KEYS[1], 'status', 'paused', 'cancelled')
if not rh[1] then return {'', 0, 0} end
local was_paused, cancelled = rh[2] and 1 or 0, rh[3] and 1 or 0
if rh[1] == 'running' and was_paused == 0 and cancelled == 0 then
  redis.call('HSET', KEYS[1], 'paused', ARGV[1], 'pause_reason', ARGV[2])
  wake(KEYS[1], 'p')
end
return {rh[1], was_paused, cancelled}
