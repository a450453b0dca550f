-- Prologue of the scheduling scripts (the gate's limits, the throttle, the fleet's shares):
-- `now` is Redis server time in microseconds, so workers on different machines agree on it.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(x) return string.format('%.0f', x) end
