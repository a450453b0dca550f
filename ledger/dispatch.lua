-- KEYS: 1 counters, 2 run hash, 3 active (on a cluster the counters again: the caller updates
--       the set); ARGV: 1 run, 2 step, 3 n
local n = tonumber(ARGV[3])
redis.call('HINCRBY', KEYS[1], ARGV[2] .. ':dispatched', n)
redis.call('HINCRBY', KEYS[1], 'dispatched', n)
redis.call('HINCRBY', KEYS[1], 'outstanding', n)
redis.call('HSET', KEYS[2], 'status', 'running')
redis.call('HDEL', KEYS[2], 'finished')
if KEYS[3] ~= KEYS[1] then redis.call('SADD', KEYS[3], ARGV[1]) end  -- a cluster: the caller's
return 1
