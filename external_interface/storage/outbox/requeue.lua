-- Move one dead letter back into the outbox and take its items off `store_failed`.
-- KEYS: 1 outbox, 2 dead stream, 3 counters (or the outbox again when there is no run)
-- ARGV: 1 dead id, 2 step, 3 n, 4.. original fields
if redis.call('XDEL', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
local n = tonumber(ARGV[3])
if KEYS[3] ~= KEYS[1] and n > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[2] .. ':store_failed', -n)
  redis.call('HINCRBY', KEYS[3], 'store_failed', -n)
end
return 1
